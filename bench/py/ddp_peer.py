"""PyTorch DDP peer of `trireme train gpt`: the same GPT (bench/py/gpt.py), the same training loop.

Launch with torchrun (torch.distributed.run), one process per data-parallel rank:

    OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo python -m torch.distributed.run --standalone \
        --nproc-per-node 2 bench/py/ddp_peer.py --steps 30 --batch 16 --seq 128 \
        --layers 4 --dim 256 --heads 4 --bucket-mb 25 --out /tmp/peer

Mirrors trireme/cli/train_worker.cpp: backend gloo (2 Gloo threads, PyTorch's default, as
Trireme), torch.set_num_threads(1), DDP(bucket_cap_mb=--bucket-mb, first bucket
--first-bucket-mb as Trireme's; see PeerDDP), the global batch split evenly over ranks and into --micro-batches
(no_sync() on all but the last), AdamW(betas 0.9/0.95, weight_decay 0.1), linear warm-up over
a tenth of the steps then cosine to --min-lr, clip to global norm --clip, mean cross-entropy,
random windows of the bundled corpus (--zero 1: PyTorch's ZeroRedundancyOptimizer, its
ZeRO-1, around the same AdamW), and a loss all-reduce per step for logging (Trireme does
the same, inside its step time).

With --checkpoint-every N, rank 0 torch.saves the model, optimizer and batch generators every
N steps (OUT/checkpoint/state.pt), and a restarted worker (torchrun --max-restarts) torch.loads
it and continues: the plain-restart peer of bench/fault_tolerance's recovery.

Rank 0 writes OUT/metrics.jsonl, one JSON object per step: step, loss, lr, tokens_per_s,
step_ms, forward_ms, backward_ms (in DDP this includes waiting for the last buckets'
all-reduce), optimizer_ms, grad_norm, checkpoint_ms, restart (torchrun's restart count); and OUT/buckets.json with DDP's bucket sizes in bytes
and every rank's AdamW state bytes.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import Gpt, GptConfig  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_CORPUS = os.path.join(REPO, "assets", "corpus", "kjv.txt")


def lr_at(step: int, peak: float, floor: float, warmup: int, total: int) -> float:
    """Same formula as trireme::optim::LrSchedule::at."""
    if step < warmup:
        return peak * (step + 1) / warmup
    decay = max(1, total - warmup)
    p = min(1.0, (step - warmup) / decay)
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * p))


class PeerDDP(DDP):
    """DDP whose first bucket is --first-bucket-mb even when bucket_cap_mb is given.

    Stock DDP uses its small first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES, 1 MiB) only when
    bucket_cap_mb is left at None; with an explicit cap every bucket, the first included, is
    the cap. Trireme always has a small first bucket (--first-bucket-mb), so the peer forces
    DDP's 'default cap' path and sets the first-bucket size, to bucket alike.
    """

    @property
    def bucket_bytes_cap_default(self) -> bool:
        return True

    @bucket_bytes_cap_default.setter
    def bucket_bytes_cap_default(self, _value: bool) -> None:
        pass


def bucket_sizes(ddp: DDP) -> list[int]:
    """DDP's bucket sizes in bytes, in all-reduce order (best effort; [] if unavailable)."""
    try:
        data = ddp._get_ddp_logging_data()
        sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes", "")
        if isinstance(sizes, str):
            return [int(s) for s in sizes.replace(",", " ").split() if s.strip()]
        return [int(s) for s in sizes]
    except Exception:  # private API; the bench falls back to its own estimate
        return []


def main() -> int:
    ap = argparse.ArgumentParser(description="PyTorch DDP peer of `trireme train gpt`")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=16, help="global batch in sequences")
    ap.add_argument("--micro-batches", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=-1, help="-1: a tenth of --steps")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--first-bucket-mb", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--zero", type=int, default=0, choices=(0, 1),
                    help="1: ZeroRedundancyOptimizer (PyTorch's ZeRO-1) around AdamW")
    ap.add_argument("--data", default=DEFAULT_CORPUS)
    ap.add_argument("--out", required=True, help="directory for metrics.jsonl (rank 0)")
    ap.add_argument("--checkpoint-every", type=int, default=0,
                    help="torch.save the state every N steps into --checkpoint-dir (0: never)")
    ap.add_argument("--checkpoint-dir", help="default: OUT/checkpoint")
    args = ap.parse_args()

    torch.set_num_threads(1)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun (2.7, --standalone) keeps one agent store across restarts, and Gloo's
        # rendezvous keys of the killed generation are still in it: the restarted workers'
        # connectFullMesh fails on them. A prefix per restart keeps the generations apart.
        store = dist.PrefixStore(f"peer-restart-{restart}", dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]), False))
        dist.init_process_group("gloo", store=store, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % (world * args.micro_batches) != 0:
        if rank == 0:
            print(f"ddp_peer: --batch {args.batch} is not divisible by world size {world} x "
                  f"--micro-batches {args.micro_batches}", file=sys.stderr)
        dist.destroy_process_group()
        return 2
    micro = args.batch // world // args.micro_batches
    warmup = args.steps // 10 if args.warmup < 0 else args.warmup

    cfg = GptConfig(vocab=args.vocab, seq_len=args.seq, layers=args.layers, dim=args.dim,
                    heads=args.heads)
    model = Gpt(cfg, args.seed)
    dist._DEFAULT_FIRST_BUCKET_BYTES = int(args.first_bucket_mb * 1024 * 1024)
    ddp = PeerDDP(model, bucket_cap_mb=args.bucket_mb)
    if args.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                      lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                weight_decay=args.weight_decay)

    with open(args.data, "rb") as f:
        corpus = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
    n_windows = corpus.numel() - args.seq - 1
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)  # any random windows will do
    ar = torch.arange(args.seq + 1)

    def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
        offs = torch.randint(0, n_windows, (micro, 1), generator=gen)
        w = corpus[offs + ar].long()                       # (B, T+1)
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    # Plain checkpointing, the way a PyTorch job without in-memory snapshots restarts: rank
    # 0 torch.saves the model, optimizer and every rank's batch generator (a rename makes the
    # file appear whole); after torchrun restarts the workers (--max-restarts), each one
    # torch.loads it and continues from its step.
    ckpt = os.path.join(args.checkpoint_dir or os.path.join(args.out, "checkpoint"), "state.pt")
    first = 0
    if os.path.exists(ckpt):
        t = time.perf_counter()
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generators"][rank])
        first = state["step"]
        if rank == 0:
            print(f"ddp_peer: resumed at step {first} in {(time.perf_counter() - t) * 1e3:.1f} ms (torch.load)",
                  file=sys.stderr, flush=True)

    def save(steps_done: int) -> float:
        t = time.perf_counter()
        generators = [None] * world
        dist.all_gather_object(generators, gen.get_state())
        if rank == 0:
            os.makedirs(os.path.dirname(ckpt), exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "generators": generators,
                        "step": steps_done}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
        return (time.perf_counter() - t) * 1e3

    metrics = None
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        metrics = open(os.path.join(args.out, "metrics.jsonl"), "a" if first else "w")
    tokens_per_step = args.batch * args.seq

    for step in range(first, args.steps):
        lr = lr_at(step, args.lr, args.min_lr, warmup, args.steps)
        for g in opt.param_groups:
            g["lr"] = lr
        t0 = time.perf_counter()
        fwd = bwd = 0.0
        local_loss = torch.zeros(1, dtype=torch.float64)
        for m in range(args.micro_batches):
            x, y = make_batch()
            last = m + 1 == args.micro_batches
            ctx = ddp.no_sync() if not last else _null()
            with ctx:
                f0 = time.perf_counter()
                logits = ddp(x)
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.size(-1)), y.reshape(-1)) / args.micro_batches
                f1 = time.perf_counter()
                loss.backward()          # DDP: returns once the gradients are averaged
                b1 = time.perf_counter()
            local_loss += loss.detach().double()
            fwd += f1 - f0
            bwd += b1 - f1
        o0 = time.perf_counter()
        if args.clip > 0:
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        else:
            gn = torch.linalg.vector_norm(
                torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
        opt.step()
        opt.zero_grad(set_to_none=False)
        o1 = time.perf_counter()
        if world > 1:
            dist.all_reduce(local_loss)
        step_s = time.perf_counter() - t0
        # The step's line is written after its torch.save, as Trireme's leader writes its
        # line after the step's snapshot or checkpoint hold: on both sides a line means the
        # next step can start, so bench/fault_tolerance's kill -> first step after the
        # restart counts the synchronous save that holds that step (step_ms leaves it out).
        save_ms = save(step + 1) if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0 else 0.0
        if metrics is not None:
            metrics.write(json.dumps({
                "step": step + 1, "loss": local_loss.item() / world, "lr": lr,
                "tokens_per_s": tokens_per_step / step_s, "step_ms": step_s * 1e3,
                "forward_ms": fwd * 1e3, "backward_ms": bwd * 1e3,
                "optimizer_ms": (o1 - o0) * 1e3, "grad_norm": float(gn),
                "checkpoint_ms": save_ms, "restart": restart}) + "\n")
            metrics.flush()

    # This rank's AdamW state (exp_avg, exp_avg_sq), gathered on rank 0.
    local_opt = opt.optim if args.zero else opt
    state_bytes = sum(t.numel() * t.element_size() for st in local_opt.state.values()
                      for k, t in st.items() if torch.is_tensor(t) and k != "step")
    states = [None] * world
    dist.all_gather_object(states, state_bytes)
    if metrics is not None:
        metrics.close()
        with open(os.path.join(args.out, "buckets.json"), "w") as f:
            json.dump({"bucket_bytes": bucket_sizes(ddp),
                       "parameters": model.num_parameters(), "world_size": world,
                       "optimizer_state_bytes": states}, f)
    dist.barrier()
    dist.destroy_process_group()
    return 0


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main())
