"""Persistent checkpoints through `trireme train gpt` (real processes over Gloo):

- resuming from a checkpoint reproduces the uninterrupted run bit for bit (DP=2, DP=2 x
  PP=2, ZeRO-2), per-step losses and final parameters;
- a checkpoint written under DP=2 x PP=2 loads under 1 process, DP=4, PP=4, TP=2, ZeRO-2
  at DP=4 and ZeRO-1 at DP=2 x PP=2: the loaded parameters are equal, and one more step
  from it (which uses the optimizer state) matches the writer's next step within 1e-5;
- a flipped byte and a truncated file are refused by `trireme checkpoint inspect` with a
  message naming the file and the failed check, and `--resume` falls back to the older
  checkpoint; a foreign manifest is refused;
- only the newest --keep-checkpoints remain."""
import json
import os
import shutil
import unittest

from common import max_abs_diff, metrics, read_params, run, temp_dir

MODEL = ["--layers", "2", "--dim", "32", "--heads", "2", "--seq", "16", "--batch", "8",
         "--lr", "3e-3", "--warmup", "0", "--quiet", "--clip", "0.05",
         "--bucket-mb", "0.02", "--first-bucket-mb", "0.01"]


def train(out, nproc, layout, steps, extra=()):
    dump = out + f".step{steps}.params"
    run(["train", "gpt", "--nproc-per-node", str(nproc), "--out", out, "--dump-params", dump,
         "--steps", str(steps)] + layout + MODEL + list(extra), timeout=300)
    return dump


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
        resumed = raw(train(out, nproc, layout, 6, ["--resume"]))
        losses = [m["loss"] for m in metrics(out)]
        ref = [m["loss"] for m in metrics(os.path.join(self.dir, "straight"))]
        print(f"{' '.join(layout) or '1 process'}: resumed at step 3, losses equal: {losses == ref}, "
              f"parameters bitwise equal: {resumed == straight}")
        self.assertEqual([m["step"] for m in metrics(out)], [1, 2, 3, 4, 5, 6])
        self.assertEqual(losses, ref)
        self.assertEqual(resumed, straight)

    def test_bitwise_resume_dp2(self):
        self.check_bitwise_resume(2, ["--dp", "2"])

    def test_bitwise_resume_dp2_pp2(self):
        self.check_bitwise_resume(4, ["--dp", "2", "--pp", "2", "--micro-batches", "2"])

    def test_bitwise_resume_zero2(self):
        self.check_bitwise_resume(2, ["--dp", "2", "--zero", "2"])

    def test_load_under_other_layouts(self):
        ref = os.path.join(self.dir, "ref")
        writer = ["--dp", "2", "--pp", "2", "--micro-batches", "2"]
        train(ref, 4, writer, 4, ["--checkpoint-every", "3"])  # checkpoint at 3, then step 4
        ref4 = read_params(ref + ".step4.params")
        ckpt = ["--resume", "--checkpoint-dir", os.path.join(ref, "checkpoints")]
        loaded3 = None
        for nproc, layout in [(1, []), (4, ["--dp", "4"]), (4, ["--pp", "4"]), (2, ["--tp", "2"]),
                              (4, ["--dp", "4", "--zero", "2"]),
                              (4, ["--dp", "2", "--pp", "2", "--zero", "1", "--micro-batches", "2"])]:
            name = "-".join(layout).replace("--", "") or "one"
            out = os.path.join(self.dir, name)
            at3 = read_params(train(out, nproc, layout, 3, ckpt))  # loads, trains nothing
            at4 = read_params(train(out, nproc, layout, 4, ckpt))
            loaded3 = loaded3 or at3
            diff3 = max_abs_diff(loaded3, at3)
            diff4 = max_abs_diff(ref4, at4)
            print(f"checkpoint of dp2 x pp2 loaded under {name}: parameters vs 1 process's load "
                  f"{diff3:.3g}; one more step vs the writer's {diff4:.3g}")
            self.assertEqual(diff3, 0.0)
            self.assertLessEqual(diff4, 1e-5)

    def damaged_run(self):
        out = os.path.join(self.dir, "run")
        train(out, 2, ["--dp", "2"], 4, ["--checkpoint-every", "2"])
        return out, os.path.join(out, "checkpoints")

    def inspect(self, path):
        proc = run(["checkpoint", "inspect", path], check=False)
        return proc.returncode, proc.stdout, [l for l in proc.stderr.splitlines() if l.strip()]

    def check_fallback(self, out, root, expect):
        code, _, err = self.inspect(os.path.join(root, "4"))
        print(f"inspect of the damaged checkpoint: exit {code}: {err[-1] if err else ''}")
        self.assertEqual(code, 1)
        self.assertEqual(len(err), 1)
        self.assertIn("rank-1.bin", err[0])
        self.assertIn(expect, err[0])
        code, stdout, _ = self.inspect(root)
        self.assertEqual(code, 0)
        self.assertIn("skipped:", stdout)
        self.assertIn("step 2,", stdout)
        proc = run(["train", "gpt", "--nproc-per-node", "2", "--dp", "2", "--out", out, "--steps", "4",
                    "--resume", "--sample-tokens", "0"] + [a for a in MODEL if a != "--quiet"],
                   timeout=300)  # not --quiet: it says where it resumed
        self.assertIn("skipping a damaged checkpoint", proc.stderr)
        self.assertIn("resumed at step 2 from", proc.stderr)

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

    def test_foreign_manifest_refused(self):
        _, root = self.damaged_run()
        manifest = os.path.join(root, "4", "manifest.json")
        with open(manifest) as f:
            data = json.load(f)
        data["format"] = "someone-elses"
        with open(manifest, "w") as f:
            json.dump(data, f)
        code, _, err = self.inspect(os.path.join(root, "4"))
        self.assertEqual(code, 1)
        self.assertIn("not a Trireme checkpoint", err[0])

    def test_retention(self):
        out = os.path.join(self.dir, "keep")
        train(out, 1, [], 5, ["--checkpoint-every", "1", "--keep-checkpoints", "2"])
        self.assertEqual(sorted(os.listdir(os.path.join(out, "checkpoints"))), ["4", "5"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
