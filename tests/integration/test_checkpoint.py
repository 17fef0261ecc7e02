"""Persistent checkpoints through `trireme train gpt` (real processes over Gloo):

- resuming from a checkpoint reproduces the uninterrupted run bit for bit (DP=2, DP=2 x
  PP=2, ZeRO-2), per-step losses and final parameters; the resumed run says it resumed at
  step 3 (a run that found no checkpoint would retrain from 0 and match too);
- a checkpoint written under DP=2 x PP=2 loads under 1 process, DP=4, PP=4, TP=2, ZeRO-2
  at DP=4 and ZeRO-1 at DP=2 x PP=2 (at its last step: it trains nothing): each layout's
  loaded parameters equal the checkpoint's own, read from its files (max abs diff 0,
  printed), and after one more step the parameters and the optimizer state
  (exp_avg, exp_avg_sq, step; read back from the checkpoint each layout writes) match the
  writer's within 1e-5 (the state relative to each tensor's largest element, since
  exp_avg_sq is of the order of 1e-6);
- a flipped byte, a truncated file, a manifest whose step is not its directory's and one
  whose slices overlap (TP=2) are refused by `trireme checkpoint inspect` with a message
  naming the file and the failed check, and `--resume` falls back to the older
  checkpoint; a foreign manifest is refused; inspecting a step's directory that has no
  manifest names the missing manifest;
- only the newest --keep-checkpoints remain;
- the manifest records the model's flags, and a --resume under other ones (other --heads
  at the same --dim, fewer --layers) is refused with one line naming both;
- --resume with no checkpoint to resume from is a first run (it says so), bit for bit
  (DP=2, PP=2 x TP=2): the initial values the restore would have replaced are set after
  all."""
import json
import os
import shutil
import unittest

from common import main, max_abs_diff, metrics, read_params, run, temp_dir, worst

MODEL = ["--layers", "2", "--dim", "32", "--heads", "2", "--seq", "16", "--batch", "8",
         "--lr", "3e-3", "--warmup", "0", "--quiet", "--clip", "0.05",
         "--bucket-mb", "0.02", "--first-bucket-mb", "0.01"]


# Not --quiet, so that a --resume run says where it resumed (and no sample, to be quick):
# a run that found no checkpoint would retrain from step 0 and could match anyway.
LOUD = [a for a in MODEL if a != "--quiet"] + ["--sample-tokens", "0"]


def train(out, nproc, layout, steps, extra=()):
    dump = out + f".step{steps}.params"
    run(["train", "gpt", "--nproc-per-node", str(nproc), "--out", out, "--dump-params", dump,
         "--steps", str(steps)] + layout + MODEL + list(extra), timeout=300)
    return dump


def resume(out, nproc, layout, steps, extra=()):
    """train() with --resume, not --quiet: its --dump-params file and its stderr."""
    dump = out + f".step{steps}.params"
    proc = run(["train", "gpt", "--nproc-per-node", str(nproc), "--out", out, "--dump-params", dump,
                "--steps", str(steps), "--resume"] + layout + LOUD + list(extra), timeout=300)
    return dump, proc.stderr


def rows(run_dir):
    """The metrics rows of run_dir ([] when it wrote none)."""
    return metrics(run_dir) if os.path.exists(os.path.join(run_dir, "metrics.jsonl")) else []


def read_checkpoint(directory):
    """A checkpoint's tensors, whole, by name (assembled from its slices with torch)."""
    import torch
    dtypes = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64,
              "uint8": torch.uint8}
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)
    out = {}
    for name, t in manifest["tensors"].items():
        whole = torch.zeros(t["shape"], dtype=dtypes[t["dtype"]])
        for s in t["slices"]:
            with open(os.path.join(directory, s["file"]), "rb") as f:
                f.seek(s["offset"])
                data = bytearray(f.read(s["bytes"]))
            piece = torch.frombuffer(data, dtype=dtypes[t["dtype"]]).reshape(s["size"])
            view = whole
            for d, (start, size) in enumerate(zip(s["start"], s["size"])):
                view = view.narrow(d, start, size)
            view.copy_(piece)
        out[name] = whole
    return out


def raw(path):
    with open(path, "rb") as f:
        return f.read()


class Checkpoints(unittest.TestCase):
    def setUp(self):
        self.dir = temp_dir()

    def check_bitwise_resume(self, nproc, layout):
        straight = raw(train(os.path.join(self.dir, "straight"), nproc, layout, 6))
        out = os.path.join(self.dir, "stopped")
        train(out, nproc, layout, 6, ["--checkpoint-every", "3"])
        # Lose everything after step 3: the newest checkpoint and the metrics of steps 4-6.
        shutil.rmtree(os.path.join(out, "checkpoints", "6"))
        with open(os.path.join(out, "metrics.jsonl")) as f:
            lines = f.readlines()[:3]
        with open(os.path.join(out, "metrics.jsonl"), "w") as f:
            f.writelines(lines)
        dump, stderr = resume(out, nproc, layout, 6)
        self.assertIn(f"resumed at step 3 from {os.path.join(out, 'checkpoints')} in", stderr, stderr[-3000:])
        resumed = raw(dump)
        losses = [m["loss"] for m in metrics(out)]
        ref = [m["loss"] for m in metrics(os.path.join(self.dir, "straight"))]
        print(f"{' '.join(layout) or '1 process'}: resumed at step 3, losses equal: {losses == ref}, "
              f"parameters bitwise equal: {resumed == straight}")
        self.assertEqual([m["step"] for m in metrics(out)], [1, 2, 3, 4, 5, 6])
        self.assertEqual(losses, ref)
        self.assertEqual(resumed, straight)

    def test_resume_drops_a_cut_metrics_line(self):
        # A crash (or a full disk) as step 3's line was written leaves half a line; the
        # resumed run keeps only whole records, so metrics.jsonl stays one JSON object a line.
        out = os.path.join(self.dir, "cut")
        train(out, 1, [], 6, ["--checkpoint-every", "3"])
        shutil.rmtree(os.path.join(out, "checkpoints", "6"))
        with open(os.path.join(out, "metrics.jsonl")) as f:
            lines = f.readlines()[:3]
        with open(os.path.join(out, "metrics.jsonl"), "w") as f:
            f.writelines(lines[:2] + [lines[2][:len(lines[2]) // 2]])
        _, stderr = resume(out, 1, [], 6)
        self.assertIn("resumed at step 3", stderr, stderr[-3000:])
        # (Step 3's record was lost with the crash: the resumed run starts at step 4.)
        self.assertEqual([m["step"] for m in metrics(out)], [1, 2, 4, 5, 6])

    def test_bitwise_resume_dp2(self):
        self.check_bitwise_resume(2, ["--dp", "2"])

    def test_bitwise_resume_dp2_pp2(self):
        self.check_bitwise_resume(4, ["--dp", "2", "--pp", "2", "--micro-batches", "2"])

    def test_bitwise_resume_zero2(self):
        self.check_bitwise_resume(2, ["--dp", "2", "--zero", "2"])

    def check_nothing_to_resume(self, nproc, layout):
        # --resume builds the model without its seeded initial values and skips the
        # replicas' initial broadcast, for the restore to fill; with no checkpoint to
        # restore, both must still happen: the run is the one without --resume.
        straight = raw(train(os.path.join(self.dir, "straight"), nproc, layout, 2))
        dump, stderr = resume(os.path.join(self.dir, "empty"), nproc, layout, 2)
        self.assertIn("nothing to resume from", stderr, stderr[-3000:])
        self.assertNotIn("resumed at step", stderr)
        resumed = raw(dump)
        print(f"{' '.join(layout)}: --resume with no checkpoint, parameters bitwise equal to a first run: "
              f"{resumed == straight}")
        self.assertEqual(resumed, straight)

    def test_resume_under_other_model_flags_is_refused(self):
        # Same --dim, other --heads (or fewer --layers): every parameter this run has is in
        # the checkpoint with its shape, so only the recorded model flags can tell.
        out = os.path.join(self.dir, "run")
        train(out, 1, [], 2, ["--checkpoint-every", "2"])
        code, stdout, err = self.inspect(os.path.join(out, "checkpoints", "2"))
        self.assertEqual(code, 0, err)
        self.assertIn("model --vocab 256 --seq 16 --layers 2 --dim 32 --heads 2 --mlp-ratio 4", stdout)
        for flags in (["--heads", "4"], ["--layers", "1"]):
            model = [a for a in LOUD]
            i = model.index(flags[0])
            model[i + 1] = flags[1]
            proc = run(["train", "gpt", "--nproc-per-node", "1", "--out", out, "--steps", "4", "--resume"] + model,
                       check=False, timeout=120)
            errors = [l for l in proc.stderr.splitlines() if "error" in l]
            print(f"--resume {' '.join(flags)}: exit {proc.returncode}: {errors[-1] if errors else proc.stderr[-300:]}")
            self.assertNotEqual(proc.returncode, 0)
            self.assertIn("is of another model (--vocab 256 --seq 16 --layers 2 --dim 32 --heads 2", proc.stderr)
            self.assertIn("resume with the flags that wrote it", proc.stderr)
            self.assertEqual([m["step"] for m in metrics(out)], [1, 2])  # nothing trained

    def test_nothing_to_resume_dp2(self):
        self.check_nothing_to_resume(2, ["--dp", "2"])

    def test_nothing_to_resume_pp2_tp2(self):
        self.check_nothing_to_resume(4, ["--pp", "2", "--tp", "2", "--micro-batches", "2"])

    def test_load_under_other_layouts(self):
        ref = os.path.join(self.dir, "ref")
        writer = ["--dp", "2", "--pp", "2", "--micro-batches", "2"]
        # Checkpoints at steps 1..4; the loaders start from step 3's.
        train(ref, 4, writer, 4, ["--checkpoint-every", "1", "--keep-checkpoints", "5"])
        ref4 = read_params(ref + ".step4.params")
        ref_state = read_checkpoint(os.path.join(ref, "checkpoints", "4"))
        # The writer's parameters at step 3, whole, as its checkpoint holds them: what every
        # layout must load (a --dump-params file's layout: name -> flat values).
        ref3 = {k[len("param/"):]: v.flatten().tolist()
                for k, v in read_checkpoint(os.path.join(ref, "checkpoints", "3")).items() if k.startswith("param/")}
        for nproc, layout in [(1, []), (4, ["--dp", "4"]), (4, ["--pp", "4"]), (2, ["--tp", "2"]),
                              (4, ["--dp", "4", "--zero", "2"]),
                              (4, ["--dp", "2", "--pp", "2", "--zero", "1", "--micro-batches", "2"])]:
            name = "-".join(layout).replace("--", "") or "one"
            out = os.path.join(self.dir, name)
            root = os.path.join(self.dir, name + "-checkpoints")
            shutil.copytree(os.path.join(ref, "checkpoints", "3"), os.path.join(root, "3"))
            ckpt = ["--checkpoint-dir", root]
            dump, stderr = resume(out, nproc, layout, 3, ckpt)  # loads, trains nothing
            self.assertIn(f"resumed at step 3 from {root} in", stderr, stderr[-3000:])
            self.assertEqual(rows(out), [], "a run resumed at its last step trained")
            at3 = read_params(dump)
            # One more step, checkpointed under this layout: its optimizer state must be
            # the writer's, tensor for tensor (a wrongly loaded state would show here).
            dump, stderr = resume(out, nproc, layout, 4, ckpt + ["--checkpoint-every", "1"])
            self.assertIn(f"resumed at step 3 from {root} in", stderr, stderr[-3000:])
            self.assertEqual([m["step"] for m in rows(out)], [4])
            at4 = read_params(dump)
            state4 = read_checkpoint(os.path.join(root, "4"))
            diff3 = max_abs_diff(ref3, at3)
            diff4 = max_abs_diff(ref4, at4)
            # The same tensors (generator states and bucket layouts are per rank, so their
            # count follows the layout).
            def per_rank(k):
                return k.startswith(("rng/", "buckets/"))
            self.assertEqual(sorted(k for k in state4 if not per_rank(k)), sorted(k for k in ref_state if not per_rank(k)))
            # Relative to each tensor's own scale: exp_avg_sq is ~1e-6, so an absolute
            # bound would pass a state loaded as zeros.
            def relative(k):
                return float((state4[k] - ref_state[k]).abs().max() / ref_state[k].abs().max().clamp(min=1e-30))
            # (worst: inf when one is NaN, which max() would let through.)
            state_diff = worst(relative(k) for k in ref_state if not per_rank(k))
            print(f"checkpoint of dp2 x pp2 loaded under {name}: max abs diff of the loaded parameters vs "
                  f"the checkpoint's (step 3) {diff3:.3g}; one more step: parameters {diff4:.3g}, "
                  f"its checkpoint (params, exp_avg, exp_avg_sq, step) vs the writer's {state_diff:.3g} "
                  f"(max relative to each tensor's scale)")
            self.assertEqual(diff3, 0.0)
            self.assertLessEqual(diff4, 1e-5)
            self.assertLessEqual(state_diff, 1e-5)
            steps = [k for k in ref_state if k.startswith("step/")]
            self.assertTrue(steps and all(int(state4[k][0]) == 4 for k in steps))

    def damaged_run(self, layout=("--dp", "2")):
        out = os.path.join(self.dir, "run")
        train(out, 2, list(layout), 4, ["--checkpoint-every", "2"])
        return out, os.path.join(out, "checkpoints")

    def inspect(self, path):
        proc = run(["checkpoint", "inspect", path], check=False)
        return proc.returncode, proc.stdout, [l for l in proc.stderr.splitlines() if l.strip()]

    def check_fallback(self, out, root, expect, file="rank-1.bin", layout=("--dp", "2")):
        code, _, err = self.inspect(os.path.join(root, "4"))
        print(f"inspect of the damaged checkpoint: exit {code}: {err[-1] if err else ''}")
        self.assertEqual(code, 1)
        self.assertEqual(len(err), 1)
        self.assertIn(os.path.join(root, "4", file), err[0])
        self.assertIn(expect, err[0])
        code, stdout, _ = self.inspect(root)
        self.assertEqual(code, 0)
        self.assertIn("skipped:", stdout)
        self.assertIn("step 2,", stdout)
        dump = out + ".fallback.params"
        proc = run(["train", "gpt", "--nproc-per-node", "2"] + list(layout) + ["--out", out, "--steps", "4",
                    "--resume", "--sample-tokens", "0", "--dump-params", dump] + [a for a in MODEL if a != "--quiet"],
                   timeout=300)  # not --quiet: it says where it resumed
        self.assertIn("skipping a damaged checkpoint", proc.stderr)
        self.assertIn(os.path.join(root, "4", file), proc.stderr)
        self.assertIn("resumed at step 2 from", proc.stderr)
        # The older checkpoint served whole: steps 3 and 4 again, on the same layout, end
        # where the uninterrupted run ended, to the bit.
        straight = train(os.path.join(self.dir, "uninterrupted"), 2, list(layout), 4)
        diff = max_abs_diff(read_params(straight), read_params(dump))
        print(f"resumed from the older checkpoint (step 2) to step 4: max abs diff vs the uninterrupted run {diff:.3g}")
        with open(straight, "rb") as a, open(dump, "rb") as b:
            self.assertTrue(a.read() == b.read(), "parameters differ from the uninterrupted run")

    @staticmethod
    def edit_manifest(directory, edit):
        path = os.path.join(directory, "manifest.json")
        with open(path) as f:
            data = json.load(f)
        edit(data)
        with open(path, "w") as f:
            json.dump(data, f)

    def test_flipped_byte_falls_back(self):
        out, root = self.damaged_run()
        path = os.path.join(root, "4", "rank-1.bin")
        with open(path, "r+b") as f:
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 0x10]))
        self.check_fallback(out, root, "CRC-32 mismatch")

    def test_truncated_file_falls_back(self):
        out, root = self.damaged_run()
        path = os.path.join(root, "4", "rank-1.bin")
        os.truncate(path, os.path.getsize(path) // 2)
        self.check_fallback(out, root, "truncated")

    def test_manifest_of_another_step_falls_back(self):
        # The manifest has no checksum: a step that is not its directory's is refused, not
        # resumed from as step 6.
        out, root = self.damaged_run()
        self.edit_manifest(os.path.join(root, "4"), lambda data: data.update(step=6))
        self.check_fallback(out, root, "step 6 in the directory of step 4", file="manifest.json")

    def test_manifest_with_a_changed_name_falls_back(self):
        # A tensor's name changed in the manifest (valid JSON, every structural check
        # passes): its CRC-32 of the tensors fails, and the older checkpoint serves (before,
        # the damaged one was chosen and its load failed: "another model").
        out, root = self.damaged_run()

        def rename(data):
            name = sorted(n for n in data["tensors"] if n.startswith("param/"))[0]
            data["tensors"][name + "x"] = data["tensors"].pop(name)

        self.edit_manifest(os.path.join(root, "4"), rename)
        self.check_fallback(out, root, "its tensors do not match their CRC-32", file="manifest.json")

    def test_manifest_with_overlapping_slices_falls_back(self):
        # Under TP=2 a split weight has one slice per rank. Moved onto the other, the second
        # slice still seems to cover the tensor (readers count the elements the slices
        # cover) while half of it would never be read.
        layout = ("--tp", "2")
        out, root = self.damaged_run(layout)
        moved = []

        def overlap(data):
            for name, t in sorted(data["tensors"].items()):
                if name.startswith("param/") and len(t["slices"]) == 2:
                    t["slices"][1]["start"] = list(t["slices"][0]["start"])
                    moved.append(name)
                    return

        self.edit_manifest(os.path.join(root, "4"), overlap)
        self.assertEqual(len(moved), 1)
        self.check_fallback(out, root, f"tensor {moved[0]}: slices", file="manifest.json", layout=layout)
        code, _, err = self.inspect(os.path.join(root, "4"))
        self.assertIn("overlap", err[0])

    def test_inspect_of_a_step_without_manifest(self):
        # A step's directory whose write a crash interrupted is that checkpoint, reported
        # as incomplete, not a directory searched for checkpoints inside it.
        out = os.path.join(self.dir, "run")
        train(out, 1, [], 2, ["--checkpoint-every", "2"])
        step = os.path.join(out, "checkpoints", "2")
        os.remove(os.path.join(step, "manifest.json"))
        for path in (step, step + "/"):
            code, _, err = self.inspect(path)
            print(f"inspect {path}: exit {code}: {err[-1] if err else ''}")
            self.assertEqual(code, 1, err)
            self.assertEqual(len(err), 1, err)
            self.assertIn("manifest.json: missing (the checkpoint was not completed)", err[0])

    def test_inspect_of_a_root_named_as_a_number(self):
        # A root named by a job id (SLURM's /scratch/987654) holding steps is a root, not
        # one incomplete checkpoint (before: "987654/manifest.json: missing").
        out = os.path.join(self.dir, "run")
        train(out, 1, [], 2, ["--checkpoint-every", "2"])
        root = os.path.join(self.dir, "987654")
        os.rename(os.path.join(out, "checkpoints"), root)
        for path in (root, root + "/"):
            code, stdout, err = self.inspect(path)
            self.assertEqual(code, 0, err)
            self.assertIn("step 2,", stdout)
            self.assertRegex(stdout, r"checkpoint \S*/987654/+2\n")

    def test_foreign_manifest_refused(self):
        _, root = self.damaged_run()
        manifest = os.path.join(root, "4", "manifest.json")
        with open(manifest) as f:
            data = json.load(f)
        self.format = data["format"]
        data["format"] = "someone-elses"
        with open(manifest, "w") as f:
            json.dump(data, f)
        code, _, err = self.inspect(os.path.join(root, "4"))
        self.assertEqual(code, 1)
        self.assertIn("not a Trireme checkpoint", err[0])
        # A format or version of another type: the same refusal naming the file (a number
        # or null format was json's own error, naming nothing, and --resume did not skip
        # to an older step; version 2^32 + 1 read as 1).
        for field, value, message in (("format", 1, "not a Trireme checkpoint"),
                                      ("format", None, "not a Trireme checkpoint"),
                                      ("version", 2 ** 32 + 1, "format version 4294967297")):
            with open(manifest, "w") as f:
                json.dump(dict(data, **{"format": self.format, field: value}), f)
            code, _, err = self.inspect(os.path.join(root, "4"))
            self.assertEqual((code, len(err)), (1, 1), err)
            self.assertIn(manifest + ": " + message, err[0])
        # A manifest without tensors, or a tensor without slices, describes no state: refused
        # (before: "verified", and --resume failed hard instead of skipping it).
        name = sorted(data["tensors"])[0]
        sliceless = dict(data, tensors=dict(data["tensors"], **{name: dict(data["tensors"][name], slices=[])}))
        for bad, message in ((dict(data, tensors={}), "it holds no tensors"),
                             (sliceless, f"tensor {name}: its slices cover 0 of its")):
            with open(manifest, "w") as f:
                json.dump(dict(bad, format=self.format), f)
            code, _, err = self.inspect(os.path.join(root, "4"))
            self.assertEqual((code, len(err)), (1, 1), err)
            self.assertIn(message, err[0])
        # A run's --out instead of its checkpoints/: named as such.
        code, _, err = self.inspect(os.path.dirname(root))
        self.assertEqual((code, len(err)), (2, 1), err)
        self.assertIn("holds no checkpoint itself: it looks like a run's --out; inspect", err[0])
        # Numbers that JSON holds but no checkpoint has: refused, not printed as garbage.
        for field, value in (("step", 1e300), ("dp", 2 ** 40), ("tp", -1)):
            bad = dict(data, **{"format": self.format, field: value})
            with open(manifest, "w") as f:
                json.dump(bad, f)
            code, _, err = self.inspect(os.path.join(root, "4"))
            self.assertEqual(code, 1, err)
            self.assertIn(f"field {field} is not a whole number", err[0])
        # A file is not a checkpoint directory.
        code, _, err = self.inspect(manifest)
        self.assertEqual(code, 2)
        self.assertIn("is a file, not a directory", err[0])

    def test_retention(self):
        out = os.path.join(self.dir, "keep")
        train(out, 1, [], 5, ["--checkpoint-every", "1", "--keep-checkpoints", "2"])
        # (.writer: the lock of the root's one writer, left in place; no step.)
        self.assertEqual(sorted(os.listdir(os.path.join(out, "checkpoints"))), [".writer", "4", "5"])


if __name__ == "__main__":
    main()
