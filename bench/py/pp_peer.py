"""PyTorch pipeline-parallel peer of `trireme train gpt --pp P --schedule S`.

Trains the reference GPT of bench/py/gpt.py with PyTorch's own pipeline parallelism
(torch.distributed.pipelining, torch 2.7), one process per pipeline stage, so tokens/s can be
compared with Trireme's schedules side by side:

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 bench/py/pp_peer.py --schedule 1f1b \
        --layers 4 --dim 256 --heads 4 --seq 128 --batch 16 --micro-batches 8 --steps 6 \
        --lr 3e-3 --clip 1 --seed 1 --out /tmp/pp_peer.jsonl

Terms, as in trireme/parallel/pipeline/schedule.h:
  p        pipeline ranks = world size (pipeline parallelism only, no data parallelism)
  v        model chunks per rank (--chunks; 1, or 2 by default for interleaved)
  layer    one entry of [embeddings (wte+wpe), block 0..L-1, head (ln_f + linear head)],
           the same layer list as Trireme's C++ GPT
  part     the layers of one virtual stage; the layer list is cut into p*v contiguous parts
           balanced by parameter count with the same linear-partition DP as Trireme's
           balance_partition (ties keep the earliest cut), so both sides split alike
  virtual stage s = chunk*p + rank: rank r holds stages r, r+p, ... (PyTorch's "loop" order)

Schedule names map onto torch 2.7.1 classes as follows (SCHEDULES below):
  gpipe        ScheduleGPipe
  1f1b         Schedule1F1B
  interleaved  ScheduleInterleaved1F1B, v stages per rank (default v = 2)
  zb-h1        ScheduleInterleavedZeroBubble with ONE stage per rank (default v = 1).
               torch 2.7 has no class named ZB-H1. This class implements the zero-bubble
               paper's ZB1P for v stages per rank; with v = 1 its order is ZB-H1's: 1F1B
               warm-up of p-r-1 forwards, backward split into B (input gradient) and W
               (weight gradient), rank r defers its first r W's into the cool-down, peak
               live activations as 1F1B. That is also how Trireme's zb-h1 is defined.
               ScheduleZBVZeroBubble (ZB-V, exactly 2 stages per rank in a V layout) is a
               different schedule and is not used.

Per step: random token ids, torch.randint(0, 256, (B, T+1)) from a generator seeded with
seed*1000 + step (the same on every rank; the first stage takes the inputs [:, :-1], the last
the targets [:, 1:]); mean cross-entropy over logits reshaped (-1, V); PyTorch divides the
gradients by the micro-batch count (scale_grads), so they are those of the batch mean;
clipping to the global gradient norm --clip as Trireme's clip_grad_norm does under
pipelining: each rank's squared norm of its stages' gradients, all-reduced over the ranks,
the square root the global norm, every gradient scaled by clip / (norm + 1e-6) when the norm
exceeds --clip (0: the norm is still computed and all-reduced, as Trireme does, but nothing
is scaled); AdamW(lr, betas 0.9/0.95, weight_decay 0.1) at a constant --lr.

Rank 0 writes --out (JSON lines): per step {"step", "step_ms", "tokens_per_s", "loss",
"grad_norm"}, where step_ms is time.perf_counter() from a dist.barrier() that lines the ranks
up to the end of schedule.step() + the clipping + optimizer.step() + zero_grad() and of the
broadcast of the loss (the mean
micro-batch loss, never null) to rank 0 from the rank holding the last stage: like Trireme's
step, which ends with a loss all-reduce, rank 0's time includes its wait for that rank. At
the end one {"final": true, "rank": r, "maxrss_kb": ...} line per rank: the process's peak
resident memory (getrusage). Every rank builds the whole model first, to draw the same
initial parameters as gpt.py and Trireme, then keeps only its parts, so the peak includes one
full copy of the parameters.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)
from torch.distributed.pipelining import schedules as pp_schedules

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import Gpt, GptConfig  # noqa: E402

# --schedule name -> (torch class, default chunks per rank, whether chunks > 1 is allowed)
SCHEDULES = {
    "gpipe": (ScheduleGPipe, 1, False),
    "1f1b": (Schedule1F1B, 1, False),
    "interleaved": (ScheduleInterleaved1F1B, 2, True),
    "zb-h1": (ScheduleInterleavedZeroBubble, 1, True),
}
# Single-stage classes take one PipelineStage; the others a list of them.
SINGLE_STAGE = (ScheduleGPipe, Schedule1F1B)

VOCAB = 256  # byte-level, as gpt.py's default and the random token ids


class Embeddings(nn.Module):
    """Layer 0: token plus position embedding. (B,T) ids -> (B,T,C)."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding):
        super().__init__()
        self.wte = wte
        self.wpe = wpe

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1), device=idx.device)      # (T)
        return self.wte(idx) + self.wpe(pos)                     # (B,T,C)


class Head(nn.Module):
    """Last layer: final LayerNorm and the linear head. (B,T,C) -> (B,T,V)."""

    def __init__(self, ln_f: nn.LayerNorm, head: nn.Linear):
        super().__init__()
        self.ln_f = ln_f
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln_f(x))                           # (B,T,V)


class Part(nn.Module):
    """The contiguous layers of one virtual stage, run in order."""

    def __init__(self, layers: list[nn.Module]):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class _AllWork:
    """Every Work of one batch_isend_irecv; wait() waits for all of them."""

    def __init__(self, works: list[dist.Work]):
        self.works = works

    def wait(self) -> bool:
        for w in self.works:
            w.wait()
        return True


def _batch_p2p_all(p2p_ops: list[dist.P2POp], desc: str | None = None) -> _AllWork | None:
    """torch 2.7.1's schedules._batch_p2p, keeping every Work instead of only the last.

    The stock one returns dist.batch_isend_irecv(ops).pop(): right for NCCL, which coalesces
    a batch into one Work, but Gloo returns one Work per op and the dropped ones (with their
    Gloo buffers) are destroyed before they complete, so Schedule1F1B deadlocks on its first
    fused send+recv (pytorch/pytorch#132644, fixed upstream by PR #152938, after 2.7).
    """
    if not p2p_ops:
        return None
    return _AllWork(dist.batch_isend_irecv(p2p_ops))


# The schedules look the name up at call time, so this reaches every schedule class.
pp_schedules._batch_p2p = _batch_p2p_all


def layer_list(model: Gpt) -> list[nn.Module]:
    """[embeddings, block 0..L-1, head], sharing the modules (and parameters) of `model`."""
    return [Embeddings(model.wte, model.wpe), *model.h, Head(model.ln_f, model.head)]


def balance_partition(costs: list[float], parts: int) -> list[tuple[int, int]]:
    """Half-open layer ranges, `parts` contiguous non-empty ones, minimising the largest sum.

    The linear-partition DP of trireme::pipeline::balance_partition (partition.cpp):
    best[k][i] = min over j < i of max(best[k-1][j], sum(costs[j:i])); scanning j upwards
    and keeping only strict improvements, ties take the earliest cut, as the C++ does.
    """
    n = len(costs)
    if parts < 1 or n < parts:
        raise ValueError(f"cannot split {n} layers into {parts} pipeline parts (pp x chunks)")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    eps = 1e-12 * max(1.0, prefix[n])
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                worst = max(best[k - 1][j], prefix[i] - prefix[j])
                if worst < best[k][i] - eps:
                    best[k][i] = worst
                    cut[k][i] = j
    ranges: list[tuple[int, int]] = []
    i = n
    for k in range(parts, 0, -1):
        ranges.append((cut[k][i], i))
        i = cut[k][i]
    return ranges[::-1]


def format_split(ranges: list[tuple[int, int]]) -> str:
    """'0:3,3:6,6:8', as Trireme's format_split."""
    return ",".join(f"{b}:{e}" for b, e in ranges)


def clip_global_norm(params: list[torch.Tensor], max_norm: float) -> float:
    """Clips the gradients of this rank's stages to the global L2 norm over every stage, as
    Trireme's optim::clip_grad_norm with its pipeline group: each rank's squared norm,
    all-reduced (summed) over the ranks, whose square root is the norm; the gradients are
    scaled by max_norm / (norm + 1e-6) only when the norm exceeds max_norm (> 0). Returns
    the global norm."""
    grads = [q.grad for q in params if q.grad is not None]
    squared = torch.nn.utils.get_total_norm(grads, 2.0).double().pow(2).reshape(1)  # (1) this rank's part
    dist.all_reduce(squared)
    norm = squared.sqrt().item()
    if max_norm > 0 and norm > max_norm:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, torch.tensor(norm))
    return norm


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="PyTorch pipeline-parallel peer of `trireme train gpt --pp`")
    ap.add_argument("--schedule", required=True, choices=list(SCHEDULES))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16, help="global batch in sequences")
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--clip", type=float, default=1.0,
                    help="clip gradients to this global L2 norm (0: off), as trireme train's --clip")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", required=True, help="JSON-lines file written by rank 0")
    ap.add_argument("--chunks", type=int, default=None,
                    help="model chunks per rank (v); default 2 for interleaved, else 1")
    args = ap.parse_args(argv)
    _, default_chunks, multi_ok = SCHEDULES[args.schedule]
    if args.chunks is None:
        args.chunks = default_chunks
    if args.chunks < 1:
        ap.error(f"--chunks must be >= 1, got {args.chunks}")
    if args.chunks > 1 and not multi_ok:
        ap.error(f"--schedule {args.schedule} runs one stage per rank; --chunks {args.chunks} "
                 "needs interleaved or zb-h1")
    if args.micro_batches < 1 or args.batch % args.micro_batches != 0:
        ap.error(f"--batch {args.batch} is not divisible by --micro-batches {args.micro_batches}")
    if args.steps < 1:
        ap.error(f"--steps must be >= 1, got {args.steps}")
    if args.clip < 0:
        ap.error(f"--clip must be >= 0 (0 turns clipping off), got {args.clip}")
    return args


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    v = args.chunks
    cls = SCHEDULES[args.schedule][0]
    n_stages = p * v
    # Checked here rather than in parse_args because they need p; every rank sees the same
    # values, so every rank leaves the same way.
    problem = None
    if args.micro_batches < p:
        problem = f"--micro-batches {args.micro_batches} must be >= the {p} pipeline ranks"
    elif args.schedule == "interleaved" and args.micro_batches % p != 0:
        problem = (f"interleaved needs --micro-batches ({args.micro_batches}) to be a "
                   f"multiple of the {p} pipeline ranks (as Trireme)")
    elif args.layers + 2 < n_stages:
        problem = (f"{args.layers + 2} layers (emb, {args.layers} blocks, head) cannot fill "
                   f"{n_stages} stages (pp x chunks)")
    if problem is not None:
        if rank == 0:
            print(f"pp_peer: {problem}", file=sys.stderr)
        dist.destroy_process_group()
        return 2

    cfg = GptConfig(vocab=VOCAB, seq_len=args.seq, layers=args.layers, dim=args.dim,
                    heads=args.heads)
    model = Gpt(cfg, args.seed)
    layers = layer_list(model)
    costs = [float(sum(q.numel() for q in layer.parameters())) for layer in layers]
    split = balance_partition(costs, n_stages)
    del model  # each rank keeps only its own parts (via `parts` below)

    micro = args.batch // args.micro_batches
    T, C, V = args.seq, args.dim, VOCAB
    device = torch.device("cpu")
    stages: list[PipelineStage] = []
    parts: list[Part] = []
    for stage_index in range(rank, n_stages, p):              # rank, rank+p, ...
        b, e = split[stage_index]
        part = Part(layers[b:e])
        first, last = stage_index == 0, stage_index == n_stages - 1
        # Explicit shapes (meta tensors) instead of PyTorch's runtime shape inference.
        input_args = (torch.empty(micro, T, dtype=torch.long, device="meta") if first
                      else torch.empty(micro, T, C, device="meta"))   # (b,T) or (b,T,C)
        output_args = (torch.empty(micro, T, V, device="meta") if last
                       else torch.empty(micro, T, C, device="meta"))  # (b,T,V) or (b,T,C)
        stages.append(PipelineStage(part, stage_index, n_stages, device,
                                    input_args=input_args, output_args=output_args))
        parts.append(part)
    del layers
    holds_first = any(s.is_first for s in stages)
    holds_last = any(s.is_last for s in stages)
    last_rank = (n_stages - 1) % p                             # loop order: stage s on s % p

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    if cls in SINGLE_STAGE:
        schedule = cls(stages[0], n_microbatches=args.micro_batches, loss_fn=loss_fn)
    else:
        schedule = cls(stages, n_microbatches=args.micro_batches, loss_fn=loss_fn)

    params = [q for part in parts for q in part.parameters()]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)

    if rank == 0:
        note = (" (torch 2.7 has no ZB-H1 class: ZB1P with one stage per rank, which orders "
                "F/B/W as ZB-H1)" if args.schedule == "zb-h1" and v == 1 else "")
        print(f"pp_peer: schedule {args.schedule} -> {cls.__name__}{note}; p={p} v={v} "
              f"m={args.micro_batches} micro-batch={micro}x{T}", flush=True)
        print(f"pp_peer: layers [emb, block 0..{args.layers - 1}, head] split "
              f"{format_split(split)} (parameters per part "
              f"{[int(sum(costs[b:e])) for b, e in split]})", flush=True)

    out = open(args.out, "w") if rank == 0 else None
    tokens_per_step = args.batch * args.seq
    for step in range(1, args.steps + 1):
        gen = torch.Generator().manual_seed(args.seed * 1000 + step)
        tokens = torch.randint(0, VOCAB, (args.batch, T + 1), generator=gen)  # (B,T+1)
        x = tokens[:, :-1].contiguous()                        # (B,T)
        y = tokens[:, 1:].contiguous()                         # (B,T)
        step_args = (x,) if holds_first else ()
        losses: list[torch.Tensor] = []

        # Both ranks start the step together (the previous step's loss broadcast has already
        # joined them; the barrier also waits out rank 0's metrics write below).
        dist.barrier()
        t0 = time.perf_counter()
        if holds_last:
            schedule.step(*step_args, target=y, losses=losses)
        else:
            schedule.step(*step_args)
        grad_norm = clip_global_norm(params, args.clip)
        opt.step()
        opt.zero_grad(set_to_none=False)

        # Inside the timer, as in Trireme (whose step ends with the loss all-reduce over
        # every rank): the mean micro-batch loss, from the last stage's rank to rank 0, so
        # that rank 0's step time includes its wait for the last stage to finish its step.
        loss_t = torch.zeros(1, dtype=torch.float64)
        if holds_last and losses:
            loss_t[0] = torch.stack([l.detach() for l in losses]).double().mean()
        dist.broadcast(loss_t, src=last_rank)
        step_s = time.perf_counter() - t0
        if out is not None:
            out.write(json.dumps({"step": step, "step_ms": step_s * 1e3,
                                  "tokens_per_s": tokens_per_step / step_s,
                                  "loss": loss_t.item(), "grad_norm": grad_norm}) + "\n")
            out.flush()

    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    gathered: list[int | None] = [None] * p
    dist.all_gather_object(gathered, maxrss)
    if out is not None:
        for r, kb in enumerate(gathered):
            out.write(json.dumps({"final": True, "rank": r, "maxrss_kb": kb}) + "\n")
        out.close()
        print(f"pp_peer: wrote {args.out}", flush=True)
    dist.barrier()
    # Not destroy_process_group(): with pipelining's point-to-point work still referenced
    # by the schedule objects, Gloo's destroy occasionally never returns on one rank once
    # the other has left. Everything is written; leave without tearing the group down.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
