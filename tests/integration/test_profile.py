"""`trireme profile gpt`: two real ranks measure a small GPT's layers (whole, and split over
both ranks as a tensor-parallel group of 2), the links between them, how much of an
all-reduce hides under compute and the matmul throughput, and rank 0 writes the profile as
JSON; bad flags are refused with one line and exit 2 before any rank starts.

Times are only checked to be positive (never against a bound: this machine is shared), the
overlap to be a share in [0, 1]. Sizes are checked exactly where they follow from the
model: the output of the embeddings and of every block is b*T*C fp32 values, the head's
b*T*V (b*T*V/2 at tp 2: each rank has its vocabulary slice of the logits); parameter counts
are those of GptConfig::num_parameters, layer by layer."""
import json
import os
import unittest

from common import main, run, temp_dir

V, T, L, C, H, R = 256, 16, 2, 32, 2, 4  # vocab, seq, layers, dim, heads, mlp ratio
SMALL = ["--layers", str(L), "--dim", str(C), "--heads", str(H), "--seq", str(T)]


def layer_parameters():
    block = 4 * C * C + 2 * R * C * C + (9 + R) * C  # ln_1, qkv, proj, ln_2, fc, proj
    return {"embeddings": V * C + T * C, "head": C * V + 2 * C,
            **{f"h.{l}": block for l in range(L)}}


class Profile(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.out = os.path.join(temp_dir(), "profile.json")
        cls.proc = run(["profile", "gpt"] + SMALL +
                       ["--micro-batch-sizes", "2,1", "--repeats", "2", "--out", cls.out], timeout=120)
        with open(cls.out) as f:
            cls.profile = json.load(f)

    def test_header(self):
        p = self.profile
        print(json.dumps({k: v for k, v in p.items() if k != "layers"}, indent=1))
        self.assertEqual(p["format"], 1)
        self.assertTrue(p["source"].startswith("measured by trireme profile on "), p["source"])
        self.assertEqual(p["device"], "cpu, 1 thread per rank")
        self.assertEqual(p["threads"], 1)
        self.assertEqual(p["repeats"], 2)
        self.assertEqual(p["model"], {"vocab": V, "seq_len": T, "layers": L, "dim": C, "heads": H,
                                      "mlp_ratio": R})
        self.assertEqual(p["state_bytes"], {"param": 4, "grad": 4, "optimizer": 8})
        self.assertGreater(p["reference_tflops"], 0)
        self.assertLess(p["reference_tflops"], 100)  # TFLOPS, not GFLOP/s or FLOP/s
        # The share of an all-reduce's time hidden under compute: measured, so not -1.
        self.assertGreaterEqual(p["overlap"], 0)
        self.assertLessEqual(p["overlap"], 1)

    def test_whole_model_in_place(self):
        # The whole model's forward and backward, timed as one step at every micro-batch
        # size (times are checked for presence, not compared: timings are not assertions).
        p = self.profile
        rows = p["whole_model"]
        sizes = sorted({t["micro_batch"] for t in p["layers"][0]["timings"]})
        self.assertEqual([r["micro_batch"] for r in rows], sizes)
        self.assertTrue(all(r["forward_backward_s"] > 0 for r in rows), rows)

    def test_data_parallel_and_pipeline_training_steps(self):
        # A data-parallel step over both ranks at every micro-batch size (the calibration's
        # measurement), and the factor it gives, printed.
        p = self.profile
        rows = p["training_step"]
        sizes = sorted({t["micro_batch"] for t in p["layers"][0]["timings"]})
        self.assertEqual([r["micro_batch"] for r in rows], sizes)
        self.assertTrue(all(r["step_s"] > 0 and r["data_parallel"] == 2 for r in rows), rows)
        self.assertIn("calibration: compute in training", self.proc.stdout)
        # And a 1F1B pipeline step over both ranks as the two stages (embeddings and the
        # first block on one, the last block and the head on the other).
        rows = p["pipeline_step"]
        self.assertEqual([r["micro_batch"] for r in rows], sizes)
        self.assertTrue(all(r["step_s"] > 0 and r["stages"] == 2 and r["micro_batches"] == 4 and
                            r["split"] == "0:2,2:4" for r in rows), rows)

    def test_links(self):
        p = self.profile
        self.assertEqual(p["allreduce"]["world"], 2)
        for name in ("p2p", "allreduce"):
            link = p[name]
            self.assertGreaterEqual(link["latency_s"], 0, name)
            self.assertLess(link["latency_s"], 1, name)
            self.assertGreater(link["bandwidth_Bps"], 0, name)

    def test_every_layer_timed_at_every_micro_batch(self):
        layers = self.profile["layers"]
        self.assertEqual([l["name"] for l in layers], ["embeddings"] + [f"h.{i}" for i in range(L)] + ["head"])
        expected_parameters = layer_parameters()
        for layer in layers:
            name = layer["name"]
            print(name, [(t["micro_batch"], round(t["forward_s"] * 1e3, 3), round(t["backward_input_s"] * 1e3, 3),
                          round(t["backward_weight_s"] * 1e3, 3), t["activation_bytes"]) for t in layer["timings"]])
            self.assertEqual(layer["parameters"], expected_parameters[name], name)
            self.assertGreater(layer["optimizer_s"], 0, name)
            self.assertEqual([t["micro_batch"] for t in layer["timings"]], [1, 2], name)
            for t in layer["timings"]:
                self.assertGreater(t["forward_s"], 0, name)
                self.assertGreater(t["backward_input_s"], 0, name)
                if name == "embeddings":  # token ids have no gradient: the whole backward is B
                    self.assertEqual(t["backward_weight_s"], 0, name)
                else:  # blocks and head defer their linear layers' weight gradients to W
                    self.assertGreater(t["backward_weight_s"], 0, name)
                width = V if name == "head" else C
                self.assertEqual(t["output_bytes"], t["micro_batch"] * T * width * 4, name)

    def test_every_layer_timed_at_tensor_parallel_2(self):
        for layer in self.profile["layers"]:
            name = layer["name"]
            self.assertIn("tensor_parallel", layer, name)
            self.assertEqual([tp["tp"] for tp in layer["tensor_parallel"]], [2], name)
            rows = layer["tensor_parallel"][0]["timings"]
            print(name, "tp=2", [(t["micro_batch"], round(t["forward_s"] * 1e3, 3),
                                  round(t["backward_input_s"] * 1e3, 3), round(t["backward_weight_s"] * 1e3, 3),
                                  t["activation_bytes"]) for t in rows])
            self.assertEqual([t["micro_batch"] for t in rows], [1, 2], name)
            for t, whole in zip(rows, layer["timings"]):
                self.assertGreater(t["forward_s"], 0, name)
                self.assertGreater(t["backward_input_s"], 0, name)
                if name == "embeddings":
                    self.assertEqual(t["backward_weight_s"], 0, name)
                else:  # the column- and row-parallel layers defer their weight gradients too
                    self.assertGreater(t["backward_weight_s"], 0, name)
                width = V // 2 if name == "head" else C
                self.assertEqual(t["output_bytes"], t["micro_batch"] * T * width * 4, name)
                self.assertGreater(t["activation_bytes"], 0, name)
                if name.startswith("h."):  # the heads and the MLP's hidden features are split
                    self.assertLess(t["activation_bytes"], whole["activation_bytes"], name)

    def test_activations_grow_with_micro_batch(self):
        for layer in self.profile["layers"]:
            one, two = (t["activation_bytes"] for t in layer["timings"])
            self.assertGreater(one, 0, layer["name"])
            self.assertGreater(two, one, layer["name"])
            if layer["name"].startswith("h."):
                # At least the block's output and its MLP's two hidden (b,T,R*C) tensors.
                self.assertGreaterEqual(one, (1 + 2 * R) * T * C * 4, layer["name"])

    def test_progress_and_summary(self):
        stderr, stdout = self.proc.stderr, self.proc.stdout
        for i, name in enumerate(["embeddings", "h.0", "h.1", "head"]):
            self.assertIn(f"[{i + 1}/{L + 2}] {name}:", stderr)
        self.assertIn("point-to-point latency", stderr)
        self.assertIn("overlap ", stderr)
        for name in ["embeddings", "h.0", "h.1", "head"]:
            self.assertIn(f"{name} at tp=2:", stderr)
        self.assertIn(f"profile: {self.out}", stdout)


class ProfileWithoutTensorParallel(unittest.TestCase):
    """An odd number of heads cannot be split over 2 ranks: no tensor-parallel timings,
    everything else as usual."""

    def test_odd_heads(self):
        out = os.path.join(temp_dir(), "profile.json")
        run(["profile", "gpt", "--layers", "1", "--dim", str(C), "--heads", "1", "--seq", str(T),
             "--micro-batch-sizes", "1", "--repeats", "1", "--out", out], timeout=120)
        with open(out) as f:
            p = json.load(f)
        self.assertEqual([l["name"] for l in p["layers"]], ["embeddings", "h.0", "head"])
        for layer in p["layers"]:
            self.assertNotIn("tensor_parallel", layer, layer["name"])
            self.assertGreater(layer["optimizer_s"], 0, layer["name"])
        self.assertGreaterEqual(p["overlap"], 0)
        self.assertLessEqual(p["overlap"], 1)


class ProfileBadInput(unittest.TestCase):
    def refuse(self, args, expect):
        out = os.path.join(temp_dir(), "profile.json")
        proc = run(["profile"] + args + (["--out", out] if "--out" not in args else []), check=False,
                   timeout=60)
        lines = [l for l in proc.stderr.splitlines() if l.strip()]
        print(f"{' '.join(args)!s:60.60} -> exit {proc.returncode}: {lines[-1] if lines else ''}")
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        self.assertEqual(len(lines), 1, f"expected one line, got:\n{proc.stderr}")
        self.assertIn(expect, lines[0])
        self.assertFalse(os.path.exists(out))

    def test_micro_batch_sizes(self):
        self.refuse(["gpt", "--micro-batch-sizes", "0"], "--micro-batch-sizes takes positive integers")
        self.refuse(["gpt", "--micro-batch-sizes", "1,two"], "got '1,two'")
        self.refuse(["gpt", "--micro-batch-sizes", ""], "--micro-batch-sizes")

    def test_other_flags(self):
        self.refuse(["gpt", "--repeats", "0"], "--repeats must be in 1..1000")
        self.refuse(["gpt", "--dim", "30", "--heads", "4"], "--heads")
        self.refuse(["gpt", "--nproc-per-node", "1"], "needs at least 2")
        self.refuse(["bert"], "unknown model 'bert'")
        self.refuse(["gpt", "extra"], "unexpected argument 'extra' after 'trireme profile gpt'")  # (was: model 'gpt')
        # (Before: "give --max-restarts N", a flag trireme profile does not take.)
        self.refuse(["gpt", "--nnodes", "1:2", "--rdzv", "127.0.0.1:1"], "--nnodes MIN:MAX: a profile needs a fixed "
                    "set of ranks; give --nnodes N")
        self.refuse([], "name the model to profile")
        self.refuse(["gpt", "--out", "/nonexistent/dir/profile.json"], "does not exist")
        # Only the launcher flags that say where ranks run: a profile neither restarts nor
        # snapshots, and its help no longer lists what it would ignore.
        self.refuse(["gpt", "--max-restarts", "1"], "unknown flag --max-restarts for 'trireme profile'")
        self.refuse(["gpt", "--redundancy", "1+1"], "unknown flag --redundancy")


if __name__ == "__main__":
    main()
