"""Bad input to `trireme train gpt`: one line naming the problem and the fix, a non-zero
exit, no stack dump, and no worker processes left behind."""
import os
import socket
import subprocess
import unittest

from common import free_port, main, run, temp_dir, workers_alive

SMALL = ["--layers", "1", "--dim", "16", "--heads", "2", "--seq", "16", "--batch", "4",
         "--steps", "2", "--quiet"]


class TrainBadInput(unittest.TestCase):
    def refuse(self, args, expect):
        out = os.path.join(temp_dir(), "run")
        proc = run(["train", "gpt", "--out", out] + args, check=False, timeout=60)
        lines = [l for l in proc.stderr.splitlines() if l.strip()]
        print(f"{' '.join(args)!s:60.60} -> exit {proc.returncode}: {lines[-1] if lines else ''}")
        self.assertNotEqual(proc.returncode, 0)
        self.assertEqual(len(lines), 1, f"expected one line, got:\n{proc.stderr}")
        self.assertIn(expect, lines[0])
        self.assertNotIn("terminate called", proc.stderr)
        self.assertEqual(workers_alive(out), [], "worker processes left behind")

    def test_unknown_flag(self):
        self.refuse(["--nproc-per-node", "1", "--stepz", "3"] + SMALL, "unknown flag --stepz")

    def test_non_numeric_value(self):
        self.refuse(["--nproc-per-node", "1", "--steps", "ten"], "--steps expects an integer, got 'ten'")

    def test_layout_not_matching_world(self):
        self.refuse(["--nproc-per-node", "2", "--dp", "3"] + SMALL, "make dp*tp*pp equal")

    def test_batch_not_divisible(self):
        self.refuse(["--nproc-per-node", "2", "--batch", "5"] + SMALL[:-7] + ["--steps", "1"],
                    "--batch 5 is not divisible by 2")

    def test_missing_data_file(self):
        self.refuse(["--nproc-per-node", "1", "--data", "/nonexistent/corpus.txt"] + SMALL,
                    "/nonexistent/corpus.txt")

    def test_heads_not_dividing_dim(self):
        self.refuse(["--nproc-per-node", "1", "--dim", "30", "--heads", "4"], "--heads")

    def test_cuda_without_gpu(self):
        # Loads the NCCL plugin (and libtorch's CUDA part), finds no GPU on this machine.
        import shutil as _shutil
        if _shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi"], capture_output=True).returncode == 0:
            self.skipTest("a GPU is present")
        self.refuse(["--nproc-per-node", "1", "--device", "cuda"] + SMALL, "--device cuda")

    def test_model_larger_than_the_machine(self):
        # 3.3e12 parameters, 13 TB of float32 weights: refused before any worker allocates.
        self.refuse(["--nproc-per-node", "1", "--layers", "64", "--dim", "65536", "--heads", "64", "--seq", "16",
                     "--steps", "1", "--quiet"],
                    "the model has 3.3e+12 parameters: its float32 weights take 1.23e+04 GiB in each of the 1 "
                    "processes on this machine")

    def test_heads_not_divisible_by_tp(self):
        # 2 heads cannot be split 4 ways.
        self.refuse(["--nproc-per-node", "4", "--tp", "4"] + SMALL, "--heads 2 is not divisible by --tp 4")

    def test_redundancy_cpu_out_of_range(self):
        self.refuse(["--nproc-per-node", "1", "--nnodes", "2:3", "--rdzv", f"127.0.0.1:{free_port()}",
                     "--max-restarts", "1", "--redundancy", "2+1", "--redundancy-cpu", "2"] + SMALL,
                    "--redundancy-cpu must be in [0, 1] (a share of one core; 0: no limit), got 2")

    def test_standby_not_a_switch_value(self):
        self.refuse(["--nproc-per-node", "1", "--standby", "2"] + SMALL, "--standby takes 0 or 1, got 2")

    def test_zero_stage_unknown(self):
        self.refuse(["--nproc-per-node", "2", "--zero", "3"] + SMALL, "--zero 3 is not a ZeRO stage")

    def test_zero_without_data_parallelism(self):
        self.refuse(["--nproc-per-node", "2", "--tp", "2", "--zero", "1"] + SMALL,
                    "use --dp 2 or more, or drop --zero")

    def test_bad_mesh_order(self):
        self.refuse(["--nproc-per-node", "2", "--mesh-order", "tp-dp-dp"] + SMALL, "mesh order")

    def test_unknown_device(self):
        self.refuse(["--nproc-per-node", "1", "--device", "tpu"] + SMALL, "--device tpu is not known")

    # Pipeline combinations, refused before any process starts. SMALL has 1 block: 3 layers.
    def test_more_stages_than_layers(self):
        self.refuse(["--nproc-per-node", "4", "--pp", "4"] + SMALL,
                    "4 pipeline parts but the model has only 3 layers")

    def test_more_chunks_than_layers(self):
        self.refuse(["--nproc-per-node", "2", "--pp", "2", "--schedule", "interleaved", "--chunks", "2",
                     "--micro-batches", "2"] + SMALL, "4 pipeline parts but the model has only 3 layers")

    def test_interleaved_micro_batches_not_multiple_of_stages(self):
        self.refuse(["--nproc-per-node", "2", "--pp", "2", "--schedule", "interleaved",
                     "--micro-batches", "1"] + SMALL, "needs --micro-batches a multiple of --pp 2")

    def test_chunks_without_interleaved(self):
        self.refuse(["--nproc-per-node", "2", "--pp", "2", "--chunks", "2"] + SMALL,
                    "--chunks 2 needs --schedule interleaved")

    def test_unknown_schedule(self):
        self.refuse(["--nproc-per-node", "2", "--pp", "2", "--schedule", "2f2b"] + SMALL, "2f2b")

    def test_schedule_without_pipeline(self):
        self.refuse(["--nproc-per-node", "1", "--schedule", "gpipe"] + SMALL,
                    "--schedule gpipe needs a pipeline")

    def test_pipeline_on_cuda(self):
        self.refuse(["--nproc-per-node", "2", "--pp", "2", "--device", "cuda"] + SMALL,
                    "--pp 2 with --device cuda is not supported yet")

    def test_bad_pp_split(self):
        self.refuse(["--nproc-per-node", "2", "--pp", "2", "--pp-split", "0:1,2:3"] + SMALL, "--pp-split")

    def test_micro_batches_not_dividing_share(self):
        self.refuse(["--nproc-per-node", "2", "--pp", "2", "--micro-batches", "3"] + SMALL,
                    "not divisible by --micro-batches 3")

    def test_unknown_model(self):
        out = os.path.join(temp_dir(), "run")
        proc = run(["train", "bert", "--out", out], check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("the available model is: gpt", proc.stderr)

    def test_stray_argument_is_named(self):
        self.refuse(["--nproc-per-node", "1", "-n", "2"] + SMALL,
                    "unexpected argument '-n' after 'trireme train gpt'; flags start with two dashes")

    def test_flag_missing_its_value(self):
        # The next flag is not taken for the value (it wrote the parameters to a file "--quiet").
        self.refuse(["--nproc-per-node", "1", "--dump-params", "--quiet"] + SMALL[:-1],
                    "--dump-params needs a value but is followed by --quiet")

    def test_sizes_past_an_int_are_refused_not_wrapped(self):
        # 4 x 1073741824 is 0 in 32 bits: dividing by it killed the command with SIGFPE;
        # 1073741825 x 4 wraps to 4, which matched the world size.
        self.refuse(["--nproc-per-node", "4", "--tp", "4", "--pp", "1073741824"] + SMALL,
                    "--tp 4 x --pp 1073741824 = 4294967296 ranks per data-parallel replica, but the job has 4")
        self.refuse(["--nproc-per-node", "4", "--dp", "1073741825", "--pp", "4"] + SMALL,
                    "--dp 1073741825 x --tp 1 x --pp 4 = 4294967300 but the job has 4 processes")
        self.refuse(["--nproc-per-node", "2147483647", "--nnodes", "2", "--rdzv", f"127.0.0.1:{free_port()}"] + SMALL,
                    "--nproc-per-node must be in 1..1024")

    def test_counts_that_no_run_holds_are_refused(self):
        # Before: --batch 10^12 ended in std::bad_alloc in the workers, and --keep-checkpoints
        # 2^32 was cut to 0 in an int and failed at the first checkpoint naming no flag.
        self.refuse(["--nproc-per-node", "1"] + SMALL + ["--batch", "1000000000000"],
                    "--batch must be in [1, 1048576] sequences, got 1000000000000")
        self.refuse(["--nproc-per-node", "1", "--checkpoint-every", "1", "--keep-checkpoints", "4294967296"] + SMALL,
                    "--keep-checkpoints must be in [1, 1048576], got 4294967296")

    def test_paths_written_later_are_checked_before_the_run(self):
        # Before: a --checkpoint-dir that is a file failed at the first checkpoint, and a
        # --dump-params in a missing folder after the last step.
        work = temp_dir()
        afile = os.path.join(work, "afile")
        open(afile, "w").close()
        self.refuse(["--nproc-per-node", "1", "--checkpoint-every", "1", "--checkpoint-dir", afile] + SMALL,
                    f"--checkpoint-dir {afile} is a file, not a directory; choose another path")
        self.refuse(["--nproc-per-node", "1", "--checkpoint-every", "1", "--checkpoint-dir", afile + "/sub"] + SMALL,
                    f"--checkpoint-dir {afile}/sub: {afile} is a file, not a directory")
        self.refuse(["--nproc-per-node", "1", "--dump-params", os.path.join(work, "missing", "p.bin")] + SMALL,
                    f"--dump-params {work}/missing/p.bin: {work}/missing does not exist; choose another path")
        # A dump inside an --out that the run makes is fine (the check comes after --out is made).
        fresh = os.path.join(work, "fresh")
        run(["train", "gpt", "--nproc-per-node", "1", "--out", fresh, "--dump-params", fresh + "/p.bin",
             "--sample-tokens", "0"] + SMALL, timeout=120)
        self.assertTrue(os.path.exists(fresh + "/p.bin"))

    def test_replica_batches_with_an_empty_item(self):
        # "6,2," was read as 2 replicas here but counted 3 by an elastic job's generation.
        for batches in ["6,2,", "6,,2", ",6,2"]:
            self.refuse(["--nproc-per-node", "2", "--batch", "8", "--replica-batches", batches] + SMALL[:-5],
                        f"--replica-batches {batches} has an empty item (a stray comma)")

    def test_min_lr_above_lr_names_the_default(self):
        self.refuse(["--nproc-per-node", "1", "--lr", "1e-4"] + SMALL,
                    "--min-lr 0.0003 is outside [0, --lr 0.0001] (its default is 3e-4); give --min-lr at most --lr")

    def test_elastic_job_splits_replica_batches_evenly_when_smaller(self):
        # --replica-batches is for the full membership; at fewer nodes the worker splits the
        # batch evenly, so the pre-check must not refuse the list (it did: "gives 2
        # replicas but --dp is 1"). Checked as far as the next check, the missing data file.
        self.refuse(["--nnodes", "1:2", "--max-restarts", "1", "--rdzv", f"127.0.0.1:{free_port()}",
                     "--nproc-per-node", "1", "--batch", "8", "--replica-batches", "6,2",
                     "--data", "/nonexistent/corpus.txt"] + SMALL[:-5],
                    "--data /nonexistent/corpus.txt: cannot read")

    def test_snapshot_share_without_replicas_to_share_with(self):
        self.refuse(["--nproc-per-node", "1", "--snapshot-share", "1"] + SMALL, "but dp is 1; drop --snapshot-share")
        self.refuse(["--nproc-per-node", "2", "--zero", "1", "--snapshot-share", "1"] + SMALL,
                    "already splits; drop --snapshot-share or --zero")

    @staticmethod
    def small_plan():
        """A folder of its own and the plan in it: dp 2 of a 2-layer model, global batch 8."""
        work = temp_dir()
        plan = os.path.join(work, "p.json")
        run(["plan", "--analytic", "V100", "--local", "2", "--layers", "2", "--dim", "64", "--heads", "2",
             "--seq", "32", "--evaluate", "--dp", "2", "--global-batch", "8", "--out", plan])
        return work, plan

    def test_layout_flags_contradicting_a_plan(self):
        # A plan fixes layout, batch and model; a flag that says otherwise was silently
        # replaced by the plan's value. Flags equal to the plan's are fine.
        work, plan = self.small_plan()
        self.refuse(["--nproc-per-node", "2", "--plan", plan, "--dp", "1"],
                    f"--dp 1 contradicts the plan {plan}, which sets 2; drop --dp")
        self.refuse(["--nproc-per-node", "2", "--plan", plan, "--layers", "3"],
                    f"--layers 3 contradicts the plan {plan}, which sets 2")
        self.refuse(["--nproc-per-node", "2", "--plan", plan, "--mesh-order", "dp-tp-pp"],
                    "--mesh-order dp-tp-pp contradicts the plan")
        out = os.path.join(work, "ok")
        run(["train", "gpt", "--nproc-per-node", "2", "--plan", plan, "--layers", "2", "--dp", "2", "--steps", "1",
             "--quiet", "--sample-tokens", "0", "--trace-steps", "0", "--out", out], timeout=120)

    def test_plan_flags_at_their_default_and_the_plans_world(self):
        # --layers 4 and --pp 1 are the defaults: they were taken as not given and the plan's
        # values ran instead. A world other than the plan's named --dp and --pp, which the
        # user did not give.
        _, plan = self.small_plan()
        self.refuse(["--nproc-per-node", "2", "--plan", plan, "--layers", "4"],
                    f"--layers 4 contradicts the plan {plan}, which sets 2; drop --layers")
        self.refuse(["--nproc-per-node", "2", "--plan", plan, "--dp", "0"], f"--dp 0 contradicts the plan {plan}")
        self.refuse(["--nproc-per-node", "1", "--plan", plan],
                    f"the plan {plan} runs on 2 ranks but the job has 1 processes; give --nproc-per-node 2")
        self.refuse(["--nproc-per-node", "2", "--plan", plan, "--pp-balance", "time"],
                    "--pp-balance applies only to a pipeline split by measurement")

    def test_flags_that_would_be_ignored(self):
        self.refuse(["--nproc-per-node", "1", "--keep-checkpoints", "2"] + SMALL,
                    "--keep-checkpoints applies only with --checkpoint-every N")
        self.refuse(["--nproc-per-node", "1", "--standby", "1"] + SMALL,
                    "--standby 1 applies only with --max-restarts")
        self.refuse(["--nproc-per-node", "1", "--redundancy-cpu", "0.5"] + SMALL,
                    "--redundancy-cpu applies only with --redundancy K+M")
        self.refuse(["--nproc-per-node", "2", "--pp", "2", "--pp-split", "0:1,1:3", "--pp-balance", "params"] + SMALL,
                    "--pp-split gives the split; drop --pp-balance")
        self.refuse(["--nproc-per-node", "1", "--pp-balance", "params"] + SMALL,
                    "--pp-balance applies only to a pipeline split by measurement: there is no pipeline")

    def test_values_that_read_as_something_else(self):
        # An empty --data trained on the bundled corpus; --warmup -7 became a tenth of
        # --steps; ' 2' and '+2' and 0x10 were numbers; a rank past 2^32 wrapped in atoi.
        self.refuse(["--nproc-per-node", "1", "--data", ""] + SMALL, "--data needs a value, got an empty one")
        self.refuse(["--nproc-per-node", "1", "--warmup", "-7"] + SMALL,
                    "--warmup must be >= 0 steps (or -1: a tenth of --steps), got -7")
        self.refuse(["--nproc-per-node", " 1"] + SMALL, "--nproc-per-node expects an integer, got ' 1'")
        self.refuse(["--nproc-per-node", "1", "--lr", "0x10"] + SMALL, "--lr expects a finite number, got '0x10'")
        self.refuse(["--nproc-per-node", "2", "--emulate-slowdown", "4294967297:2"] + SMALL,
                    "--emulate-slowdown '4294967297:2' names a rank past any job's")
        self.refuse(["--nproc-per-node", "2", "--emulate-slowdown", "1:2,1:3"] + SMALL,
                    "--emulate-slowdown names rank 1 twice")
        self.refuse(["--nproc-per-node", "2", "--batch", "8", "--replica-batches", "99999999999999999999,1"]
                    + SMALL[:-5], "99999999999999999999 sequences are more than --batch 8")
        self.refuse(["--nproc-per-node", "1", "--log-every", "0"] + SMALL, "--log-every must be at least 1")
        self.refuse(["--nproc-per-node", "1", "--bucket-mb", "0"] + SMALL,
                    "--bucket-mb must be in (0, 1048576] MiB, got 0")

    def test_other_commands_name_the_fix(self):
        # (trireme run, schedule and checkpoint inspect: one line, exit 2.)
        def refuse(args, expect):
            proc = run(args, check=False, timeout=60)
            lines = [l for l in proc.stderr.splitlines() if l.strip()]
            print(f"{' '.join(args)!s:60.60} -> exit {proc.returncode}: {lines[-1] if lines else ''}")
            self.assertEqual(proc.returncode, 2, proc.stderr)
            self.assertEqual(len(lines), 1, proc.stderr)
            self.assertIn(expect, lines[0])

        refuse(["run", "--nproc-per-node", "1", "--standby", "1", "--", "true"],
               "--standby 1 applies only with --max-restarts")
        refuse(["run", "--nproc-per-node", "1", "--redundancy-cpu", "7", "--", "true"],
               "--redundancy-cpu must be in [0, 1]")
        refuse(["schedule", "stray"], "unexpected argument 'stray' for 'trireme schedule'; see trireme schedule --help")
        empty = temp_dir()
        refuse(["checkpoint", "inspect", empty],
               f"{empty} holds no checkpoint; pass a run's checkpoints/ directory")
        self.assertTrue(run(["schedule", "--help"]).stdout.startswith("usage: trireme schedule "))

    def test_fresh_run_among_earlier_checkpoints(self):
        # A run without --resume whose checkpoint directory holds another run's checkpoints
        # is refused: a restart falling back to disk (or a later --resume) would load that
        # run's newest step, and retention would delete this run's. --resume continues it.
        out = os.path.join(temp_dir(), "run")
        model = SMALL[:SMALL.index("--steps")] + ["--quiet"]
        args = ["train", "gpt", "--nproc-per-node", "1", "--out", out, "--checkpoint-every", "1", "--steps", "2"] + model
        run(args, timeout=120)
        proc = run(args, check=False, timeout=60)
        lines = [l for l in proc.stderr.splitlines() if l.strip()]
        print(lines[-1] if lines else proc.stderr)
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertEqual(len(lines), 1, proc.stderr)
        self.assertIn("already holds an earlier run's checkpoints (newest: step 2); pass --resume", lines[0])
        args[args.index("--steps") + 1] = "3"
        resumed = run([a for a in args if a != "--quiet"] + ["--resume", "--sample-tokens", "0"], timeout=120)
        self.assertIn("resumed at step 2", resumed.stderr)
        # The same refusal for a new --out whose --checkpoint-dir is the earlier run's: the
        # directories made for the new run are gone again.
        fresh = os.path.join(temp_dir(), "new", "run")
        moved = list(args)
        moved[moved.index("--out") + 1] = fresh + "/"  # (a trailing separator too)
        proc = run(moved + ["--checkpoint-dir", os.path.join(out, "checkpoints")], check=False, timeout=60)
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("already holds an earlier run's checkpoints", proc.stderr)
        self.assertFalse(os.path.exists(os.path.dirname(fresh)), "the refused run left its --out behind")

    def test_an_earlier_runs_output_is_not_written_over(self):
        # Before: a fresh run into an earlier run's --out replaced its metrics and traces
        # (following the refusal above with --checkpoint-dir elsewhere did too), and a
        # --resume at or past --steps trained nothing and wrote empty traces over the run's.
        # Now those are refused, and a --resume at --steps itself loads and leaves them.
        out = os.path.join(temp_dir(), "run")
        model = SMALL[:SMALL.index("--steps")] + ["--quiet", "--sample-tokens", "0"]
        base = ["train", "gpt", "--nproc-per-node", "1", "--out", out] + model
        run(base + ["--steps", "3", "--checkpoint-every", "2"], timeout=120)
        def contents(name):
            with open(os.path.join(out, name), "rb") as f:
                return f.read()

        before = {f: contents(f) for f in ("metrics.jsonl", "run.json", "timeline.tsv")}
        cases = [(["--steps", "2", "--checkpoint-dir", os.path.join(temp_dir(), "elsewhere")],
                  f"{out} holds an earlier run (metrics.jsonl); give another --out, or remove {out} to start over"),
                 (["--steps", "1", "--resume"],
                  f"the newest checkpoint in {out}/checkpoints is of step 2, past --steps 1; raise --steps to train "
                  "on (--steps 2 loads it without training)"),
                 (["--steps", "2", "--resume", "--checkpoint-dir", os.path.join(temp_dir(), "none")],
                  f"{out} holds an earlier run (metrics.jsonl) but no checkpoint to resume it from")]
        for flags, message in cases:
            proc = run(base + flags, check=False, timeout=60)
            lines = [l for l in proc.stderr.splitlines() if l.strip()]
            print(lines[-1] if lines else proc.stderr)
            self.assertEqual((proc.returncode, len(lines)), (2, 1), proc.stderr)
            self.assertIn(message, lines[0])
            for f, content in before.items():
                self.assertEqual(contents(f), content, f"{flags} changed {f}")
        loaded = run(base + ["--steps", "2", "--resume", "--dump-params", os.path.join(temp_dir(), "p.bin")])
        self.assertIn("nothing to train", loaded.stderr)
        for f, content in before.items():
            self.assertEqual(contents(f), content, f"the load at --steps changed {f}")
        run(base + ["--steps", "4", "--resume"], timeout=120)  # steps left: it goes on
        self.assertEqual(len(contents("metrics.jsonl").splitlines()), 4)

    def test_port_in_use(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            self.refuse(["--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "0",
                         "--rdzv", f"127.0.0.1:{port}"] + SMALL, str(port))


if __name__ == "__main__":
    main()
