"""Every c10d op over the "dtrain" backend, checked against values computed here and,
where torch 1.13's c10d Gloo has the op, against c10d Gloo in the same processes."""

import sys

import torch
import torch.distributed as dist

from beside_gloo import gloo_has, start

a, gloo, rank, world = start()
checks = 0

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
          torch.int64, torch.bool, torch.complex64]
# c10d Gloo in torch 1.13 has no bf16 and no bool tensors.
GLOO_DTYPES = [torch.float32, torch.float64, torch.float16, torch.int8, torch.uint8, torch.int32, torch.int64]
GLOO_DTYPES = [d for d in GLOO_DTYPES if gloo_has(d, gloo)]
print(f"rank {rank}: compared against c10d Gloo in {', '.join(str(d) for d in GLOO_DTYPES)}", flush=True)


def value(r, n, dtype):
    """Rank r's input: 1s and 2s, so sums and products of up to 6 ranks are exact in every dtype."""
    base = 1 + (torch.arange(n) + r) % 2
    if dtype == torch.bool:
        return (torch.arange(n) + r) % 3 != 0
    if dtype.is_complex:
        return torch.complex(base.float(), -base.float()).to(dtype)
    return base.to(dtype)


def expect(name, got, want):
    global checks
    checks += 1
    if got.dtype != want.dtype or not torch.equal(got, want):
        sys.exit(f"rank {rank}: {name}: got {got} expected {want}")


def reduced(op, n, dtype):
    xs = torch.stack([value(r, n, dtype) for r in range(world)])
    if dtype == torch.bool:
        return {"sum": xs.any(0), "max": xs.any(0), "product": xs.all(0), "min": xs.all(0)}[op]
    wide = xs.to(torch.complex128 if dtype.is_complex else torch.float64)
    out = {"sum": wide.sum(0), "avg": wide.sum(0) / world, "product": wide.prod(0)}.get(op)
    if out is None:
        out = getattr(wide.real if dtype.is_complex else wide, op)(0)
        out = out.values if hasattr(out, "values") else out
    return out.to(dtype)


OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
       "product": dist.ReduceOp.PRODUCT}
n = 1001
for dtype in DTYPES:
    for op in ("sum", "avg", "max", "min", "product"):
        if dtype.is_complex and op not in ("sum", "avg"):
            continue
        if op == "avg" and not (dtype.is_floating_point or dtype.is_complex):
            continue  # AVG is for floating types (as NCCL's)
        if dtype == torch.bool and op == "avg":
            continue
        t = value(rank, n, dtype)
        dist.all_reduce(t, op=OPS[op])
        expect(f"all_reduce {op} {dtype}", t, reduced(op, n, dtype))
        if dtype in GLOO_DTYPES and op != "avg":
            g = value(rank, n, dtype)
            dist.all_reduce(g, op=OPS[op], group=gloo)
            expect(f"all_reduce {op} {dtype} against c10d Gloo", t, g)

# Strided tensors are staged and written back.
m = torch.zeros(4, 6)
m[:, ::2] = rank + 1
view = m[:, ::2]
dist.all_reduce(view)
expect("all_reduce of a strided view", m[:, ::2], torch.full((4, 3), float(world * (world + 1) // 2)))
expect("all_reduce leaves the gaps", m[:, 1::2], torch.zeros(4, 3))

# allreduce_coalesced, broadcast, reduce.
ts = [torch.full((k + 1,), float(rank)) for k in range(3)]
dist.all_reduce_coalesced(ts)
for k, t in enumerate(ts):
    expect("all_reduce_coalesced", t, torch.full((k + 1,), float(world * (world - 1) // 2)))
for dtype in DTYPES:
    root = world - 1
    t = value(rank, 33, dtype) if rank == root else torch.zeros(33, dtype=dtype)
    dist.broadcast(t, src=root)
    expect(f"broadcast {dtype}", t, value(root, 33, dtype))
    if dtype.is_complex:
        continue
    t = value(rank, 33, dtype)
    dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
    expect(f"reduce max {dtype}", t, reduced("max", 33, dtype) if rank == root else value(rank, 33, dtype))

# allgather (list and tensor), reduce_scatter (list and tensor).
for dtype in DTYPES:
    outs = [torch.zeros(7, dtype=dtype) for _ in range(world)]
    dist.all_gather(outs, value(rank, 7, dtype))
    for r in range(world):
        expect(f"all_gather {dtype}", outs[r], value(r, 7, dtype))
    if dtype in GLOO_DTYPES:
        gouts = [torch.zeros(7, dtype=dtype) for _ in range(world)]
        dist.all_gather(gouts, value(rank, 7, dtype), group=gloo)
        for r in range(world):
            expect(f"all_gather {dtype} against c10d Gloo", outs[r], gouts[r])
    flat = torch.zeros(7 * world, dtype=dtype)
    dist.all_gather_into_tensor(flat, value(rank, 7, dtype))
    expect(f"all_gather_into_tensor {dtype}", flat, torch.cat([value(r, 7, dtype) for r in range(world)]))
    if dtype == torch.bool or dtype.is_complex:
        continue
    full = [value(rank, 5, dtype) * (j + 1) if dtype != torch.bool else value(rank, 5, dtype) for j in range(world)]
    out = torch.zeros(5, dtype=dtype)
    dist.reduce_scatter(out, full)
    want = sum(value(r, 5, torch.float64) for r in range(world)) * (rank + 1)
    expect(f"reduce_scatter {dtype}", out, want.to(dtype))
    out2 = torch.zeros(5, dtype=dtype)
    dist.reduce_scatter_tensor(out2, torch.cat(full))
    expect(f"reduce_scatter_tensor {dtype}", out2, want.to(dtype))

# alltoall: equal blocks, uneven splits, lists.
x = torch.arange(world * 4, dtype=torch.float32) + 100 * rank
y = torch.zeros_like(x)
dist.all_to_all_single(y, x)
expect("all_to_all_single", y, torch.cat([torch.arange(rank * 4, rank * 4 + 4, dtype=torch.float32) + 100 * r
                                          for r in range(world)]))
in_splits = [r + rank for r in range(world)]  # rank sends r + rank rows to rank r
out_splits = [rank + r for r in range(world)]
x = torch.cat([torch.full((s, 2), float(10 * rank + r)) for r, s in enumerate(in_splits)])
y = torch.zeros(sum(out_splits), 2)
dist.all_to_all_single(y, x, out_splits, in_splits)
expect("all_to_all_single uneven", y, torch.cat([torch.full((s, 2), float(10 * r + rank))
                                                 for r, s in enumerate(out_splits)]))
if dist.get_world_size() > 1:
    g = torch.zeros(sum(out_splits), 2)
    dist.all_to_all_single(g, x, out_splits, in_splits, group=gloo)
    expect("all_to_all_single uneven against c10d Gloo", y, g)
ins = [torch.full((r + 1,), float(rank)) for r in range(world)]
outs = [torch.zeros(rank + 1) for _ in range(world)]
dist.all_to_all(outs, ins)
for r in range(world):
    expect("all_to_all list", outs[r], torch.full((rank + 1,), float(r)))

# gather, scatter, send/recv, barrier.
root = 1 % world
gl = [torch.zeros(3) for _ in range(world)] if rank == root else None
dist.gather(torch.full((3,), float(rank)), gather_list=gl, dst=root)
if rank == root:
    for r in range(world):
        expect("gather", gl[r], torch.full((3,), float(r)))
out = torch.zeros(3)
dist.scatter(out, scatter_list=[torch.full((3,), float(r * 2)) for r in range(world)] if rank == root else None,
             src=root)
expect("scatter", out, torch.full((3,), float(rank * 2)))
if world > 1:
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    recv = torch.zeros(5, dtype=torch.int64)
    reqs = [dist.isend(torch.full((5,), rank, dtype=torch.int64), nxt, tag=3), dist.irecv(recv, prv, tag=3)]
    for q in reqs:
        q.wait()
    expect("isend/irecv ring", recv, torch.full((5,), prv, dtype=torch.int64))
dist.barrier()

# Objects (pickled into byte tensors: broadcast and all_gather of uint8).
objs = [{"rank": rank}] if rank == 0 else [None]
dist.broadcast_object_list(objs, src=0)
assert objs[0] == {"rank": 0}
gathered = [None] * world
dist.all_gather_object(gathered, ("r", rank))
assert gathered == [("r", r) for r in range(world)]

# Async work, futures chained as DDP's comm hooks chain them.
t = torch.ones(10)
work = dist.all_reduce(t, async_op=True)
fut = work.get_future().then(lambda f: f.value()[0] * 2)
expect("future then", fut.wait(), torch.full((10,), 2.0 * world))
assert work.is_completed() and work.is_success()

# A subgroup.
sub = dist.new_group([0, world - 1], backend="dtrain")
if rank in (0, world - 1):
    t = torch.full((4,), float(rank))
    dist.all_reduce(t, group=sub)
    expect("new_group all_reduce", t, torch.full((4,), float(world - 1)))

# What the backend does not do is named, with the plugin and the op.
for bad, call in (("recv without src", lambda: dist.recv(torch.zeros(1))),
                  ("BXOR", lambda: dist.all_reduce(torch.ones(1, dtype=torch.int32), op=dist.ReduceOp.BXOR)),
                  ("int16", lambda: dist.all_reduce(torch.ones(1, dtype=torch.int16)))):
    try:
        call()
    except RuntimeError as e:
        msg = str(e)
        if f"plugin '{a.plugin}'" not in msg and "backend 'dtrain'" not in msg:
            sys.exit(f"rank {rank}: the error for {bad} names neither the backend nor the plugin: {msg}")
    else:
        sys.exit(f"rank {rank}: {bad} did not raise")
dist.barrier()
print(f"rank {rank}: ops over dtrain ({a.plugin}): all {checks} checks passed", flush=True)

dist.destroy_process_group()
