"""`trireme report RUN_DIR` on run directories written by hand: run.json and timeline.tsv
in the format `trireme train gpt` writes, with pipeline events whose bubble is known.

The two-stage run is 1F1B with two micro-batches, F = 1 ms and B = 2 ms, traced for
steps 2 and 3 (the same events as tests/unit/test_report.cpp). Step 2 takes 9 ms with 6 ms
busy on each stage; in step 3 stage 1's last backward takes 3 ms and delays stage 0's, so
the step takes 11 ms, with stage 0 busy 6 ms and stage 1 busy 7 ms. Measured bubble:
stage 0 1 - 12/20 = 40.0%, stage 1 1 - 13/20 = 35.0%, mean 37.5%; theory
(p-1)/(m+p-1) = 33.3%."""
import json
import os
import subprocess
import unittest

from common import TRIREME, free_port, main, run, stop, temp_dir

T0_US = 1.7e15  # wall-clock microseconds, as the trainer records them


def event(lane, start_ms, end_ms, category, name, args="", label=""):
    return (f"{lane}\t{T0_US + start_ms * 1e3:.3f}\t{(end_ms - start_ms) * 1e3:.3f}\t"
            f"{category}\t{name}\t{args}\t{label}")


def op(name, step, start_ms, end_ms, lane=0):
    micro = int(name.split()[1][1:])
    args = json.dumps({"micro": micro, "chunk": 0, "step": step})
    return event(lane, start_ms, end_ms, "pipeline", name, args)


def two_stage_events():
    stage0, stage1 = [], []
    for step in (2, 3):
        t = 0 if step == 2 else 20
        slow = 0 if step == 2 else 1
        stage0 += [op("F m0 c0", step, t + 0, t + 1),
                   op("send-act m0 c0 -> 1", step, t + 1, t + 1.1, lane=1),
                   op("F m1 c0", step, t + 1, t + 2),
                   op("B m0 c0", step, t + 4, t + 6),
                   op("B m1 c0", step, t + 7 + 2 * slow, t + 9 + 2 * slow)]
        stage1 += [op("recv-act m0 c0 <- 0", step, t + 0.2, t + 1, lane=1),
                   op("F m0 c0", step, t + 1, t + 2),
                   op("B m0 c0", step, t + 2, t + 4),
                   op("F m1 c0", step, t + 4, t + 5),
                   op("B m1 c0", step, t + 5, t + 7 + slow)]
        for rows in (stage0, stage1):
            rows.append(event(0, t + 12, t + 14, "compute", "optimizer"))
    return stage0, stage1


def write_tsv(path, ranks):
    lines = [f"# trireme timeline v1 ranks={len(ranks)}"]
    for rank, events in enumerate(ranks):
        lines.append(f"# rank {rank}")
        lines += events
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def make_run(dp=1, pp=2, ranks=None, layout=None):
    """A run directory; ranks: each rank's event lines (default: the two-stage run)."""
    out = temp_dir()
    if ranks is None:
        stage0, stage1 = two_stage_events()
        # Order tp-dp-pp: rank = dp_rank + stage * dp.
        ranks = [stage0 if r // dp == 0 else stage1 for r in range(dp * pp)]
    run_json = {"command": "train gpt", "mesh": f"dp={dp} tp=1 pp={pp} (order tp-dp-pp)",
                "dp": dp, "tp": 1, "pp": pp, "schedule": "1f1b" if pp > 1 else "none",
                "micro_batches": 2, "chunks": 1, "traced_steps": [2, 3],
                "ranks": [{"rank": r, "stage": r // dp, "dp": r % dp} for r in range(dp * pp)]}
    run_json.update(layout or {})
    with open(os.path.join(out, "run.json"), "w") as f:
        json.dump(run_json, f)
    write_tsv(os.path.join(out, "timeline.tsv"), ranks)
    return out


def stage_rows(stdout):
    """Table rows: {stage: [rank, F, F ms, B, B ms, W, W ms, busy, span, bubble, theory]}."""
    rows = {}
    for line in stdout.splitlines():
        fields = line.split()
        if len(fields) == 12 and fields[0].isdigit():
            rows[int(fields[0])] = fields[1:]
    return rows


class Report(unittest.TestCase):
    def report(self, args):
        proc = run(["report"] + args, timeout=60)
        print(proc.stdout)
        return proc.stdout

    def refuse(self, args, expect):
        proc = run(["report"] + args, check=False, timeout=60)
        lines = [l for l in proc.stderr.splitlines() if l.strip()]
        print(f"{' '.join(args)!s:50.50} -> exit {proc.returncode}: {lines[-1] if lines else ''}")
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        self.assertEqual(len(lines), 1, f"expected one line, got:\n{proc.stderr}")
        for part in expect:
            self.assertIn(part, lines[0])
        return lines[0]

    def test_measured_and_theoretical_bubble(self):
        out = make_run()
        stdout = self.report([out])
        rows = stage_rows(stdout)
        self.assertEqual(sorted(rows), [0, 1])
        #                         rank  F   F ms    B   B ms    W   W ms busy     span
        self.assertEqual(rows[0], ["0", "4", "1.00", "4", "2.00", "0", "-", "12.00", "20.00",
                                   "40.0%", "33.3%"])
        self.assertEqual(rows[1], ["1", "4", "1.00", "4", "2.25", "0", "-", "13.00", "20.00",
                                   "35.0%", "33.3%"])
        mean = [l.split() for l in stdout.splitlines() if l.startswith("mean")]
        self.assertEqual(mean, [["mean", "37.5%", "33.3%"]])
        svg_path = os.path.join(out, "pipeline.svg")
        self.assertIn(f"pipeline.svg: {svg_path}", stdout.splitlines())
        with open(svg_path) as f:
            svg = f.read()
        self.assertTrue(svg.startswith("<svg"))
        self.assertIn("stage 1 (rank 1)", svg)
        self.assertIn("F m1 c0", svg)
        self.assertIn("recv-act m0 c0 &lt;- 0", svg)

    def test_stages_on_machines_whose_clocks_differ(self):
        # A real run: two agents (emulated machines), one pipeline stage each, node 1's
        # clock 30 s ahead (TRIREME_TEST_CLOCK_SKEW_US). The trainer keeps the timeline on
        # rank 0's clock, so the bubble measured is the pipeline's (before, stage 1's
        # events lay 30 s after stage 0's, and both stages read a bubble of ~100%).
        out = os.path.join(temp_dir(), "skewed")
        port = free_port()
        env = dict(os.environ, OMP_NUM_THREADS="1")
        agents = [subprocess.Popen(
            [TRIREME, "train", "gpt", "--nproc-per-node", "1", "--nnodes", "2", "--node-rank", str(node),
             "--rdzv", f"127.0.0.1:{port}", "--pp", "2", "--micro-batches", "4", "--layers", "2", "--dim", "32",
             "--heads", "2", "--seq", "16", "--batch", "8", "--steps", "4", "--sample-tokens", "0", "--quiet",
             "--out", out], env=dict(env, TRIREME_TEST_CLOCK_SKEW_US="30000000") if node == 1 else env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for node in (0, 1)]
        for agent in agents:
            self.addCleanup(stop, agent)
        for agent in agents:
            _, err = agent.communicate(timeout=300)
            self.assertEqual(agent.returncode, 0, err[-3000:])
        stdout = self.report([out])
        rows = stage_rows(stdout)
        self.assertEqual(sorted(rows), [0, 1])
        for stage, row in rows.items():
            # (Steps of a few ms on this tiny model: the bubble is high, but not ~100%.)
            self.assertLess(float(row[8]), 10000, f"the steps' windows span the clocks' skew:\n{stdout}")
            self.assertLess(float(row[9].rstrip("%")), 95, f"stage {stage}'s bubble counts the skew:\n{stdout}")

    def test_one_step(self):
        rows = stage_rows(self.report([make_run(), "--step", "3"]))
        self.assertEqual(rows[0][7:], ["6.00", "11.00", "45.5%", "33.3%"])  # 1 - 6/11
        self.assertEqual(rows[1][7:], ["7.00", "11.00", "36.4%", "33.3%"])  # 1 - 7/11
        rows = stage_rows(self.report([make_run(), "--step", "2"]))
        self.assertEqual([rows[s][9] for s in (0, 1)], ["33.3%", "33.3%"])
        self.refuse([make_run(), "--step", "5"], ["--step 5 was not traced", "steps 2-3"])

    def test_replica_picks_the_stage_ranks(self):
        out = make_run(dp=2)
        rows = stage_rows(self.report([out, "--replica", "1"]))
        self.assertEqual([rows[s][0] for s in (0, 1)], ["1", "3"])
        with open(os.path.join(out, "pipeline.svg")) as f:
            self.assertIn("stage 1 (rank 3)", f.read())
        self.refuse([out, "--replica", "2"], ["--replica 2 is outside 0..1"])

    def test_no_pipeline(self):
        ranks = [[event(0, 0, 5, "compute", "forward"),
                  event(1, 4, 6, "comm", "allreduce bucket 0")],
                 []]
        out = make_run(dp=2, pp=1, ranks=ranks)
        stdout = self.report([out])
        self.assertIn("no pipeline (pp=1)", stdout)
        with open(os.path.join(out, "pipeline.svg")) as f:
            self.assertIn("rank 1 compute", f.read())

    def test_bad_run_directories(self):
        missing = temp_dir()
        line = self.refuse([missing], ["run.json not found", f"--out {missing}"])
        self.assertIn(os.path.join(missing, "run.json"), line)
        self.refuse([os.path.join(missing, "nope")], ["run directory", "not found"])
        self.refuse([], ["missing RUN_DIR"])

        out = make_run()
        os.remove(os.path.join(out, "timeline.tsv"))
        # (trireme train refuses an --out holding a run: the fix is another --out.)
        self.refuse([out], ["timeline.tsv not found", f"train again with another --out (or remove {out} first)"])

        out = make_run()
        with open(os.path.join(out, "timeline.tsv"), "a") as f:
            f.write("0\tsoon\t5\tcompute\tforward\t\t\n")
        self.refuse([out], ["timeline.tsv: line 28: start_us must be a number, got 'soon'"])

        out = make_run()
        with open(os.path.join(out, "run.json"), "w") as f:
            f.write("{\"pp\": 2,")
        self.refuse([out], ["run.json is not valid JSON"])

        out = make_run(layout={"pp": "two"})
        line = self.refuse([out], ["run.json has no integer \"pp\"", "train again with another --out"])
        self.assertNotIn("to write it", line)
        self.refuse([out, "stray"], ["unexpected argument 'stray' for 'trireme report'; see trireme report --help"])

        out = make_run(layout={"schedule": "pipedream"})
        self.refuse([out], ["run.json", "pipedream"])

        # Sizes past an int, or whose product is (before: cut to 2, and 0 ranks drawn, exit 0).
        out = make_run(layout={"micro_batches": 4294967298})
        self.refuse([out], ["run.json: \"micro_batches\" must be an integer in [1, 2147483647], got 4294967298"])
        out = make_run(layout={"dp": 65536, "tp": 65536, "ranks": []})
        self.refuse([out], ["run.json: dp*tp*pp = 8589934592 ranks, more than a run has"])

        # A run trained with --trace-steps 0 writes [first, first - 1]: it traced nothing.
        out = make_run(layout={"traced_steps": [2, 1]})
        self.refuse([out], ["the run traced no steps (--trace-steps 0, or it resumed after", "--trace-steps N"])

    def test_a_resumed_run_names_only_the_steps_it_traced(self):
        # A generation resumed at step k traced only the window's steps after k: run.json
        # says so (it claimed the whole window, and report sent people to steps it lacks).
        out = os.path.join(temp_dir(), "run")
        model = ["--nproc-per-node", "2", "--pp", "2", "--micro-batches", "2", "--layers", "2", "--dim", "16",
                 "--heads", "2", "--seq", "16", "--batch", "4", "--quiet", "--sample-tokens", "0", "--out", out]
        run(["train", "gpt", "--steps", "3", "--trace-steps", "4", "--checkpoint-every", "2"] + model, timeout=300)
        with open(os.path.join(out, "run.json")) as f:
            self.assertEqual(json.load(f)["traced_steps"], [2, 3])  # step 1 (warm-up) is not traced
        run(["train", "gpt", "--steps", "5", "--trace-steps", "4", "--checkpoint-every", "4", "--resume"] + model,
            timeout=300)
        with open(os.path.join(out, "run.json")) as f:
            self.assertEqual(json.load(f)["traced_steps"], [3, 5])  # resumed at 2
        self.assertIn("steps 3-5", self.report([out]))
        run(["train", "gpt", "--steps", "6", "--trace-steps", "2", "--resume"] + model,
            timeout=300)  # resumed at 4, after the window (steps 2-3)
        with open(os.path.join(out, "run.json")) as f:
            self.assertEqual(json.load(f)["traced_steps"], [5, 4])
        self.refuse([out], ["the run traced no steps"])
        out = make_run(pp=1, dp=2, ranks=[[], []])
        self.refuse([out, "--step", "2"], ["--step needs a pipeline run"])

        stage0, stage1 = two_stage_events()
        no_step = event(0, 0, 1, "pipeline", "F m0 c0", '{"micro": 0}')
        out = make_run(ranks=[stage0 + [no_step], stage1])
        self.refuse([out], ["timeline.tsv: pipeline event 'F m0 c0' has no integer \"step\""])


if __name__ == "__main__":
    main()
