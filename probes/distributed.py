"""Cross-rank audits of a distributed run (CONTRACT §8): each reads the digests every rank recorded while the
script ran on all ranks (``ctx.target.distributed``, a :class:`~nnwizard.distributed.merged.DistributedRun`) and
compares them. They train nothing; tree ``distributed`` (trees/distributed.yaml) reads their outcomes.

- ``dist-run``          how every rank ended; a rank that raised an error of its own (not a lost peer)
- ``dist-collectives``  ranks that waited in different collectives, a rank waiting for a peer that was gone, a
                        communication error, the collectives entered in a different order
- ``dist-unused-params`` DistributedDataParallel's unused-parameter error, with the parameters' names
- ``dist-sampler-epoch`` a shuffling DistributedSampler that drew the same order every epoch
- ``dist-sharding``     ranks that read the same samples (identical batches, or every rank's sampler over the
                        whole data set)
- ``dist-batchnorm``    BatchNorm layers (not SyncBatchNorm) that normalise a few samples per rank
- ``dist-metric``       a printed figure that is one rank's own (or a sum over ranks) where the global one was meant
- ``dist-writes``       a file several ranks wrote
- ``dist-replicas``     replicas whose parameters differ after a step

Every result that finds a fault carries ``fix_here``: the fix at the script's own line (wizard/tailor.py).
"""

from __future__ import annotations

import functools
import math
import re
import statistics
from collections import Counter, defaultdict

from nnwizard.distributed.merged import user_frames
from nnwizard.probes.api import ProbeContext, ProbeResult, Table, cannot_run, failed, passed, probe, skipped

CROSS_RANK_PROBES = ("dist-run", "dist-collectives", "dist-unused-params", "dist-sampler-epoch", "dist-sharding",
                     "dist-batchnorm", "dist-metric", "dist-writes", "dist-replicas")
BN_SMALL = 16          # samples per rank below which a BatchNorm's batch statistics are noisy (per-GPU batch guidance)
BN_TINY = 8
SAME_INPUTS = 0.9      # share of compared steps whose first training input is identical on two ranks
PARAM_RTOL = 1e-6      # relative difference of a parameter's sum (or sum of magnitudes) that counts as different
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d+|\d+(?:\.\d+)?[eE][-+]?\d+|\.\d+)(%?)")


def _run(ctx: ProbeContext):
    return getattr(ctx.target, "distributed", None)


def on_ranks(fn):
    """A probe body ``fn(ctx, run)`` on the ranks' merged recordings; skipped when the target is not a distributed run."""
    @functools.wraps(fn)
    def measure(ctx: ProbeContext) -> ProbeResult:
        run = _run(ctx)
        if run is None:
            return skipped("not a distributed run")
        return fn(ctx, run)
    return measure


def across_ranks(fn):
    """:func:`on_ranks` for a comparison of the ranks: skipped with one rank, cannot run without two ranks' digests."""
    @functools.wraps(fn)
    def measure(ctx: ProbeContext, run) -> ProbeResult:
        if run.world < 2:
            return skipped("one rank: nothing to compare across ranks")
        if len(run.digests) < 2:
            return cannot_run(f"digests from {len(run.digests)} of {run.world} rank(s): nothing to compare across ranks",
                              reason="ranks-missing")
        return fn(ctx, run)
    return on_ranks(measure)


def _ranks(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


# ------------------------------------------------------------------------------------------------- the run
@probe("dist-run", title="How every rank's script ended", outcomes={
    "ok": "every rank ran the script to the agreed stop (or its end)",
    "rank-raised": "a rank raised an error of its own program (not a lost peer)",
    "rank-died": "a rank's process died (a signal, a backend abort) before it finished",
    "aborted": "the watchdog stopped every rank (a hang, or the hard time limit)",
    "not-distributed": "no rank called init_process_group or built DDP/FSDP: the ranks ran independent copies",
    "start-failed": "the ranks could not be started"})
@on_ranks
def dist_run(ctx: ProbeContext, run) -> ProbeResult:
    lines = [f"rank {r}: {run.ended(r)}" for r in range(run.world)]
    table = Table("ranks", "How each rank ended", ["rank", "steps", "collectives", "ended"],
                  [[r, (run.digests.get(r) or {}).get("total_steps"), (run.digests.get(r) or {}).get("collective_count"),
                    run.ended(r)] for r in range(run.world)])
    if run.start_error:
        return cannot_run(f"the {run.world} ranks could not be started: {run.start_error}", reason="start-failed",
                          ranks=lines)
    if not run.initialised():
        return failed("not-distributed", f"the script never called init_process_group nor built DistributedDataParallel "
                                         f"or FSDP on any of the {run.world} ranks: every rank ran its own copy of a "
                                         f"one-process script (diagnosed as one process)", [table], ranks=lines)
    if run.abort:
        return failed("aborted", f"the watchdog stopped every rank ({run.abort.get('text', '')}): " + "; ".join(lines),
                      [table], ranks=lines, training_raised=True)
    first = run.first_failure()
    if first is not None:
        rank, err = first
        from nnwizard.probes._crash import DDP_UNUSED

        explained = DDP_UNUSED in err.get("message", "")   # (dist-unused-params names the parameters)
        twice = "initialize the default process group twice" in err.get("message", "")
        others = [r for r in run.ranks if r != rank and run.error(r)]
        text = (f"rank {rank} raised {err['type']} at {err.get('where') or '?'} (step {err.get('step')}): "
                f"{err['message'][:200]}")
        if twice:
            calls = [c.get("where") or "?" for c in run.digests[rank].get("init", {}).get("calls", [])]
            text += f"; init_process_group was called {len(calls)} times ({', '.join(calls)}): call it once per process"
        if others:
            text += "; then " + "; ".join(f"rank {r} {run.ended(r)}" for r in others[:3])
        return failed("rank-raised", text, [table], ranks=lines, rank=rank, error=err.get("type"), where=err.get("where"),
                      training_raised=not explained)
    died = [r for r in range(run.world) if (run.digests.get(r) or {}).get("exit") == "died" or r not in run.digests]
    if died and not run.abort and not run.interrupted:
        r = died[0]
        code = run.exit_codes.get(r)
        how = (f"was killed by signal {-code}" if isinstance(code, int) and code < 0 else
               f"exited with code {code}" if code is not None else "ended")
        tail = [line for line in run.logs.get(r, []) if line.strip()][-2:]
        text = (f"rank {r}'s process {how} before it finished" + (f" (its last lines: {' | '.join(tail)[:300]})" if tail else "")
                + "; " + "; ".join(lines))
        return failed("rank-died", text, [table], ranks=lines, rank=r, exit_code=code, training_raised=True)
    return passed(f"all {run.world} ranks ran the script ({run.backend or 'no'} backend): " + "; ".join(lines), "ok",
                  [table], ranks=lines)


# ------------------------------------------------------------------------------------------- collectives
def _user_collectives(digest: dict) -> list[dict]:
    return [c for c in digest.get("collectives", []) if c.get("where")]


def _busy_text(busy: dict | None) -> str:
    if not busy:
        return "not in a collective"
    where = f" at {busy['where']}" if busy.get("where") else ""
    return f"in {busy.get('name')}{where} (step {busy.get('step')})"


@probe("dist-collectives", title="Ranks waiting in different collectives, or for a peer that is gone", outcomes={
    "ok": "every rank entered the same collectives in the same order and none waited for a peer that left",
    "hang": "the ranks hung (rank-dependent control flow, a collective one rank never reaches)",
    "mismatch": "the backend itself found the ranks in different collectives (and aborted)",
    "peer-lost": "a rank's collective failed because another rank had left it waiting (no error of its own)",
    "peer-raised": "a rank's collective failed because another rank had raised an error of its own",
    "order": "the ranks entered different collectives at the same point",
    "rendezvous": "the ranks never met: every rank waited in init_process_group"})
@on_ranks
def dist_collectives(ctx: ProbeContext, run) -> ProbeResult:
    if not run.initialised():
        return skipped("no process group: no collectives")
    stacks = {r: user_frames(s) for r, s in run.stacks.items()}
    abort = run.abort or {}
    detected = run.backend_mismatch()
    if detected:
        parts = [f"rank {r} " + _rank_state(run, r) for r in range(run.world)]
        said = detected.rsplit("] ", 1)[-1]
        return failed("mismatch", f"the {run.backend or 'communication'} backend found the ranks in different collectives "
                                  f"({said!r}): " + "; ".join(parts), stacks=stacks, detected=detected,
                      fix_here=_hang_fix(run))
    stuck = [run.busy(r) for r in range(run.world)]
    if abort and stuck and all(b and b.get("kind") == "init" for b in stuck):
        where = next((b["where"] for b in stuck if b.get("where")), "?")
        return failed("rendezvous", f"the ranks never met: every rank waited in init_process_group at {where} until the "
                                    f"watchdog stopped them ({abort.get('text', '')}); its rendezvous (init_method, or "
                                    f"MASTER_ADDR:MASTER_PORT) could not be completed: a port in use, a wrong address or "
                                    f"world size", stacks=stacks, training_raised=True)
    if abort.get("kind") in ("stalled", "peer-gone") or (abort.get("kind") == "deadline" and abort.get("busy")):
        parts = [f"rank {r} " + _rank_state(run, r) for r in range(run.world)]
        text = f"the ranks hung ({abort.get('text', 'no progress')}): " + "; ".join(parts)
        last = {r: [c["name"] + (f" at {c['where']}" if c.get("where") else "") for c in _user_collectives(d)[-3:]]
                for r, d in run.digests.items()}
        return failed("hang", text, stacks=stacks, last_collectives=last, abort=abort,
                      fix_here=_hang_fix(run))
    comm = {r: run.error(r) for r in run.ranks if run.error(r) and _comm(run.error(r))}
    if comm:
        first = run.first_failure()
        r, err = next(iter(comm.items()))
        cause = (f"rank {first[0]} had stopped: it raised {first[1]['type']} at {first[1].get('where') or '?'}"
                 if first else "; ".join(f"rank {o} {run.ended(o)}" for o in run.ranks if o not in comm) or "its peer left")
        text = (f"rank {r}'s collective failed ({err['type']} at {err.get('where') or '?'}, step {err.get('step')}: "
                f"{err['message'][:160]}) because {cause}")
        order = _order_mismatch(run)
        if order:
            text += f"; before that, {order}"
        return failed("peer-raised" if first else "peer-lost", text, stacks=stacks, errors={str(k): v.get("message", "")[:300] for k, v in comm.items()},
                      cause_rank=first[0] if first else None, fix_here=_hang_fix(run) if first is None else "")
    order = _order_mismatch(run)
    if order:
        return failed("order", f"the ranks entered different collectives: {order}", fix_here=_hang_fix(run))
    counts = {r: len(_user_collectives(d)) for r, d in run.digests.items()}
    return passed(f"every rank entered the same {max(counts.values(), default=0)} collective(s) of the script in the same "
                  f"order" + (" (and DDP's own gradient reductions)" if run.data_parallel() else ""), counts=counts)


def _rank_state(run, r: int) -> str:
    """Where a rank was when the collectives went wrong: its stack's own frames (a rank stopped or killed), what
    it waited in, or how it ended."""
    d = run.digests.get(r) or {}
    if d.get("exit") in ("aborted", "died", None):
        name, frames = run.position(r)
        if frames:
            return (f"in {name}" if name else "stopped") + f" called from {' <- '.join(frames)}"
        if name:
            return _busy_text(run.busy(r))
    err = d.get("error")
    if err:
        first = err["message"].split(". ")[0][:140]
        return f"raised {err['type']} at {err.get('where') or '?'} (step {err.get('step')}): {first}"
    return run.ended(r)


def _comm(err: dict) -> bool:
    from nnwizard.distributed.merged import is_comm_error

    return is_comm_error(err)


def _order_mismatch(run) -> str:
    """The first point where two ranks' collectives (the script's own calls) differ, in words ('' when none)."""
    seqs = {r: [(c["name"], c.get("where"), c.get("op")) for c in _user_collectives(d)] for r, d in run.digests.items()}
    if len(seqs) < 2:
        return ""
    ranks = sorted(seqs)
    base = seqs[ranks[0]]
    for r in ranks[1:]:
        other = seqs[r]
        for i, (a, b) in enumerate(zip(base, other)):
            if a[0] != b[0] or a[2] != b[2]:
                return (f"call {i + 1}: rank {ranks[0]} {a[0]} at {a[1]}, rank {r} {b[0]} at {b[1]}")
        if len(base) != len(other) and not run.abort:
            longer, shorter = (ranks[0], r) if len(base) > len(other) else (r, ranks[0])
            extra = (base if len(base) > len(other) else other)[min(len(base), len(other))]
            done = {rr: (run.digests[rr].get("total_steps")) for rr in (ranks[0], r)}
            if done[ranks[0]] == done[r] and not any(run.error(x) for x in (ranks[0], r)):
                return (f"rank {longer} entered {max(len(base), len(other))} collectives and rank {shorter} "
                        f"{min(len(base), len(other))}: rank {longer}'s {extra[0]} at {extra[1]} had no counterpart")
    return ""


def _hang_fix(run) -> str:
    sites = Counter()
    for r in range(run.world):
        name, frames = run.position(r)
        if name and frames and name not in ("backward", "DistributedDataParallel forward"):
            sites[(name, frames[0])] += 1
    if not sites:
        return ""
    (name, where), _ = sites.most_common(1)[0]
    return (f"make every rank reach the {name} at {where} the same number of times: move it out of code that only some "
            f"ranks run (an `if rank == 0:` block, a loop over per-rank data of different lengths), or give the other "
            f"ranks the same call")


# ---------------------------------------------------------------------------------------- unused params
@probe("dist-unused-params", title="DistributedDataParallel and parameters that get no gradient", outcomes={
    "ok": "every parameter DDP wraps received a gradient (or DDP was told to look for unused ones)",
    "unused": "DDP's reducer raised: parameters it wraps received no gradient"})
@on_ranks
def dist_unused_params(ctx: ProbeContext, run) -> ProbeResult:
    ddps = [(r, w) for r, d in run.digests.items() for w in d.get("ddp", [])]
    if not ddps:
        return skipped("no DistributedDataParallel was built")
    from nnwizard.probes._crash import DDP_UNUSED, ddp_unused_names

    for r in run.ranks:
        err = run.error(r)
        if err and DDP_UNUSED in err.get("message", "") + err.get("traceback", ""):
            wrapper = next((w for rr, w in ddps if rr == r), ddps[0][1])
            text = err.get("traceback", "") or err.get("message", "")
            names = ddp_unused_names(text, wrapper.get("params"))
            where = wrapper.get("where") or "?"
            which = ", ".join(names[:8]) or "some of its parameters"
            summary = (f"DistributedDataParallel over {wrapper.get('model')} (built at {where}, "
                       f"find_unused_parameters={wrapper.get('find_unused_parameters')}) raised on rank {r} at "
                       f"{err.get('where') or '?'} (step {err.get('step')}): {which} received no gradient in the backward "
                       f"before, so the reducer never finished")
            fix = (f"at {where}, pass find_unused_parameters=True to DistributedDataParallel(...) (it then looks for the "
                   f"unused parameters at every step), or remove or use the branch that holds {which}")
            return failed("unused", summary, unused=names, ddp_where=where, rank=r, fix_here=fix)
    return passed(f"{len({w.get('where') for _, w in ddps})} DistributedDataParallel wrapper(s); none raised for unused "
                  f"parameters" + (" (find_unused_parameters=True)" if any(w.get("find_unused_parameters") for _, w in ddps)
                                   else ""))


# ------------------------------------------------------------------------------------------- the sampler
@probe("dist-sampler-epoch", title="A DistributedSampler's epoch set every epoch", outcomes={
    "ok": "every shuffling DistributedSampler drew a new order each epoch",
    "epoch-not-set": "a shuffling DistributedSampler drew the same order every epoch (set_epoch never called)"})
@on_ranks
def dist_sampler_epoch(ctx: ProbeContext, run) -> ProbeResult:
    samplers = [(r, s) for r, d in sorted(run.digests.items()) for s in d.get("samplers", [])]
    shuffled = [(r, s) for r, s in samplers if s.get("shuffle")]
    if not samplers:
        return skipped("the script builds no DistributedSampler")
    if not shuffled:
        return skipped("its DistributedSampler(s) do not shuffle (shuffle=False): the epoch does not change the order")
    judged = []
    for r, s in shuffled:
        iters = s.get("iters", [])
        if len(iters) < 2:
            continue
        judged.append((r, s))
        epochs = [it["epoch"] for it in iters]
        hashes = [it["hash"] for it in iters]
        if len(set(hashes)) == 1 and len(set(epochs)) == 1:
            calls = s.get("set_epoch", [])
            how = ("set_epoch was never called" if not calls else
                   f"set_epoch was called only with epoch {calls[0]['epoch']} (at {calls[0].get('where') or '?'})")
            where = s.get("where") or "?"
            ranks = sorted({rr for rr, ss in shuffled if ss.get("where") == s.get("where") and len(ss.get("iters", [])) >= 2
                            and len({it['hash'] for it in ss['iters']}) == 1})
            summary = (f"the DistributedSampler built at {where} (shuffle=True) was iterated {len(iters)} times on "
                       f"{_ranks(ranks)} and drew the same order every time, epoch {epochs[0]} each pass ({how}): rank {r} "
                       f"began every pass with samples {iters[0]['head'][:6]}")
            fix = (f"call set_epoch(epoch) on the DistributedSampler built at {where} at the start of every epoch, before "
                   f"the loop over its DataLoader (sampler.set_epoch(epoch))")
            return failed("epoch-not-set", summary, sampler_where=where, passes=len(iters), epoch=epochs[0],
                          fix_here=fix)
    if not judged:
        return skipped("every shuffling DistributedSampler was iterated once in the recorded run: no second epoch to "
                       "compare")
    r, s = judged[0]
    epochs = [it["epoch"] for it in s["iters"]]
    return passed(f"the DistributedSampler built at {s.get('where') or '?'} drew a new order at each of its "
                  f"{len(epochs)} passes (epochs {epochs[:6]})")


# ------------------------------------------------------------------------------------------- sharding
def _training_loaders(digest: dict) -> list[dict]:
    return [l for l in digest.get("loaders", []) if any(l.get("trained", []))]


def _same_dataset(a: dict, b: dict) -> bool | None:
    """Are two ranks' data sets the same? None when their content cannot be compared."""
    if a.get("len") != b.get("len") or a.get("type") != b.get("type"):
        return False
    if "subset" in a or "subset" in b:
        sa, sb = a.get("subset"), b.get("subset")
        return bool(sa and sb and sa["hash"] == sb["hash"])
    if "tensors" in a and "tensors" in b:
        return a["tensors"] == b["tensors"]
    return None


@probe("dist-sharding", title="Each rank reads its own part of the data", outcomes={
    "ok": "the ranks read different samples (a DistributedSampler or an equivalent split)",
    "same-batches": "the ranks' training batches were identical at the same steps",
    "whole-dataset": "every rank's training sampler runs over the whole data set",
    "overlap": "a sharding sampler gave the ranks overlapping samples (its rank or num_replicas is wrong)"})
@across_ranks
def dist_sharding(ctx: ProbeContext, run) -> ProbeResult:
    ranks = run.ranks
    base = run.digests[ranks[0]]
    # identical training inputs at the same steps
    inputs = {r: {s: fp for s, fp in d.get("inputs", []) if fp} for r, d in run.digests.items()}
    same_steps, compared = 0, 0
    for r in ranks[1:]:
        common = sorted(set(inputs[ranks[0]]) & set(inputs[r]))
        compared += len(common)
        same_steps += sum(1 for s in common if inputs[ranks[0]][s] == inputs[r][s])
    loaders = _training_loaders(base)
    loader = loaders[0] if loaders else None
    site = (loader or {}).get("where")
    fix = (f"give the DataLoader built at {site or '?'} a DistributedSampler(dataset) (its shuffle, not the DataLoader's) "
           f"and call sampler.set_epoch(epoch) every epoch, or split the data by rank (dataset[rank::world_size])")
    if compared >= 3 and same_steps >= SAME_INPUTS * compared:
        detail = ""
        if loader is not None and loader.get("passes"):
            detail = (f"; the DataLoader built at {site or '?'} draws from a {loader['sampler']} over all "
                      f"{loader['dataset'].get('len')} samples on every rank")
        return failed("same-batches", f"{same_steps} of {compared} recorded training steps fed the model the same batch on "
                                      f"{_ranks(ranks)} (identical input at the same step){detail}: the ranks train on "
                                      f"the same samples, and the world size only repeats them", same=same_steps,
                      compared=compared, fix_here=fix)
    if loader is None:
        if compared:
            return passed(f"the ranks' training inputs differed at {compared - same_steps} of {compared} compared steps")
        return skipped("no training DataLoader and no training input was recorded on every rank")
    # every rank's sampler over the whole data set
    others = [_training_loaders(run.digests[r]) for r in ranks[1:]]
    if any(not o for o in others):
        return skipped("not every rank iterated a training DataLoader")
    whole = []
    for r, ls in zip(ranks, [loaders] + others):
        l0 = ls[0]
        n = l0["dataset"].get("len")
        length = l0.get("sampler_len")
        if l0.get("distributed_sampler") is None and n and length is not None and length >= n:
            whole.append(r)
    if len(whole) == len(ranks):
        verdicts = [_same_dataset(loader["dataset"], _training_loaders(run.digests[r])[0]["dataset"]) for r in ranks[1:]]
        if all(v is not False for v in verdicts):
            known = all(v is True for v in verdicts)
            overlap = _overlap(loader, _training_loaders(run.digests[ranks[1]])[0])
            text = (f"every rank's training DataLoader (built at {site or '?'}) draws from a {loader['sampler']} over the "
                    f"whole data set ({loader['dataset'].get('len')} samples; no DistributedSampler)")
            if overlap is not None:
                text += (f"; in the recorded passes rank {ranks[1]} read {overlap:.0%} of the samples rank {ranks[0]} read")
            text += (": each epoch reads every sample once per rank" if known else
                     " (nnwizard could not compare the data sets' content; they have the same type and length)")
            return failed("whole-dataset", text, known=known, overlap=overlap, fix_here=fix)
        return passed("each rank's DataLoader runs over a data set of its own (their content differs)")
    # a sharding sampler: the samples must not overlap
    overlaps = [_overlap(loader, _training_loaders(run.digests[r])[0]) for r in ranks[1:]]
    worst = max((o for o in overlaps if o is not None), default=None)
    if worst is not None and worst > 0.5:
        sampler = next((s for s in base.get("samplers", []) if s["index"] == loader.get("distributed_sampler")), None)
        extra = (f" (built at {sampler.get('where') or '?'} with num_replicas={sampler['replicas']}, rank={sampler['rank']} "
                 f"on rank {ranks[0]})") if sampler else ""
        return failed("overlap", f"the ranks' DistributedSampler{extra} gave them overlapping samples: {worst:.0%} of what "
                                 f"rank {ranks[1]} read in its first pass rank {ranks[0]} read too",
                      overlap=worst, fix_here="build the DistributedSampler with the defaults (num_replicas and rank from "
                                              "the process group) or with num_replicas=world_size, rank=rank")
    text = f"the ranks read different samples ({loader['sampler']} over {loader['dataset'].get('len')} samples"
    if worst is not None:
        text += f"; {worst:.0%} overlap in the recorded first pass"
    return passed(text + ")")


def _overlap(a: dict, b: dict) -> float | None:
    pa, pb = a.get("passes") or [], b.get("passes") or []
    if not pa or not pb or not pa[0]["indices"] or not pb[0]["indices"]:
        return None
    n = min(len(pa[0]["indices"]), len(pb[0]["indices"]))
    first, second = set(pa[0]["indices"][:n]), pb[0]["indices"][:n]
    return sum(1 for i in second if i in first) / len(second)


# ------------------------------------------------------------------------------------------ batchnorm
@probe("dist-batchnorm", title="BatchNorm statistics over a few samples per rank", outcomes={
    "ok": "no unsynced BatchNorm normalises a small per-rank batch",
    "small-batches": "BatchNorm layers (not SyncBatchNorm) compute their statistics over a few samples per rank"})
@across_ranks
def dist_batchnorm(ctx: ProbeContext, run) -> ProbeResult:
    base = run.digests[run.ranks[0]]
    layers = base.get("bn_layers", [])
    if not layers:
        return skipped("the trained model has no BatchNorm layer")
    if not run.data_parallel():
        return skipped("no DistributedDataParallel or FSDP: the ranks train their own models")
    plain = [i for i, l in enumerate(layers) if not l.get("sync")]
    if not plain:
        return passed(f"all {len(layers)} BatchNorm layer(s) are SyncBatchNorm: their statistics span the ranks")
    per_rank = {r: defaultdict(list) for r in run.ranks}
    for r, d in run.digests.items():
        for e in d.get("bn", []):
            per_rank[r][(e["layer"], e["step"])].append(e)
    samples = [e["samples"] for e in base.get("bn", []) if e["layer"] in plain]
    if not samples:
        return skipped("no training forward through the BatchNorm layers was recorded")
    n = int(statistics.median(samples))
    spread = _bn_spread(per_rank, run.ranks, plain)
    names = ", ".join(f"{layers[i]['layer']} ({layers[i]['class']})" for i in plain[:3])
    world = run.world
    if n >= BN_SMALL:
        return passed(f"{names} normalise {n} samples per rank: enough for per-rank statistics", samples=n)
    measured = (f"; at the same step the ranks' batch means differed by {spread:.2f} of the feature's standard deviation "
                f"on average" if spread is not None else "")
    ddp = next((w for w in base.get("ddp", [])), None)
    where = f" before DistributedDataParallel(...) at {ddp['where']}" if ddp and ddp.get("where") else ""
    fix = (f"convert the model{where}: model = nn.SyncBatchNorm.convert_sync_batchnorm(model) (statistics over all "
           f"{n * world} samples of a step; nccl on GPUs), or give each rank a batch of {BN_SMALL} or more samples "
           f"(now {n})")
    return failed("small-batches", f"{names} of {layers[plain[0]]['model']} normalise each rank's {n} samples with "
                                   f"statistics of those {n} alone (not SyncBatchNorm; {n * world} samples over the "
                                   f"{world} ranks){measured}", samples=n, spread=spread, tiny=n <= BN_TINY,
                  fix_here=fix)


def _bn_spread(per_rank: dict, ranks: list[int], layers: list[int]) -> float | None:
    diffs = []
    for key, entries in per_rank[ranks[0]].items():
        if key[0] not in layers:
            continue
        a = entries[0]
        for r in ranks[1:]:
            other = per_rank[r].get(key)
            if not other:
                continue
            b = other[0]
            for ma, mb, va, vb in zip(a["mean"], b["mean"], a["var"], b["var"]):
                sd = math.sqrt(max((va + vb) / 2, 1e-12))
                diffs.append(abs(ma - mb) / sd)
    return statistics.fmean(diffs) if diffs else None


# ------------------------------------------------------------------------------------------- metrics
def _numbers(text: str) -> list[tuple[float, int, bool]]:
    """(value, decimals, percent) of the figures in a printed line (integers such as epoch numbers left out)."""
    out = []
    for m in NUMBER.finditer(text):
        token = m.group(0).rstrip("%")
        try:
            value = float(token)
        except ValueError:
            continue
        decimals = len(token.split(".")[1].split("e")[0].split("E")[0]) if "." in token else 0
        out.append((value, decimals, bool(m.group(1))))
    return out


def _matches(printed: tuple[float, int, bool], value: float | None) -> bool:
    if value is None or not math.isfinite(value):
        return False
    x, decimals, pct = printed
    tol = 0.5 * 10 ** (-decimals) if decimals else max(abs(x) * 1e-3, 1e-12)
    tol += abs(x) * 1e-6
    return any(abs(x - v) <= tol for v in ((value, value * 100) if pct or x > 1.5 and value <= 1 else (value,)))


def _window(digest: dict, lo: int, hi: int) -> dict[str, float]:
    """One rank's figures over the steps (lo, hi]: its training loss (mean and last), and its evaluation loss and
    accuracy (the evaluation loss calls in that window)."""
    out: dict[str, float] = {}
    losses = [l for s, l, *_ in digest.get("steps", []) if lo < s <= hi and isinstance(l, (int, float))]
    if len(losses) >= 2:   # (one batch's loss printed by rank 0 is a progress line, not a figure for the whole run)
        out["train_loss_mean"] = statistics.fmean(losses)
    calls = [c for c in digest.get("eval_calls", []) if lo < c["step"] <= hi and isinstance(c.get("value"), (int, float))]
    if calls:
        counts = [c.get("count") or 0 for c in calls]
        total = sum(counts)
        values = [c["value"] / (c.get("count") or 1) if c.get("reduction") == "sum" else c["value"] for c in calls]
        out["eval_loss"] = (sum(v * n for v, n in zip(values, counts)) / total) if total else statistics.fmean(values)
        out["_eval_count"] = total
        if all("correct" in c for c in calls) and total:
            out["eval_acc"] = sum(c["correct"] for c in calls) / total
            out["_correct"] = sum(c["correct"] for c in calls)
    return out


def _global(windows: dict[int, dict[str, float]], key: str) -> dict[str, float]:
    """The global figure over the ranks' windows (a sample-weighted mean for evaluation figures), and their sum."""
    values = {r: w[key] for r, w in windows.items() if key in w}
    if len(values) < len(windows):
        return {}
    if key == "eval_acc":
        total = sum(w["_eval_count"] for w in windows.values())
        mean = sum(w["_correct"] for w in windows.values()) / total if total else None
    elif key == "eval_loss":
        total = sum(w["_eval_count"] for w in windows.values())
        mean = sum(w[key] * w["_eval_count"] for w in windows.values()) / total if total else None
    else:
        mean = statistics.fmean(values.values())
    return {"mean": mean, "sum": sum(values.values())}


LABELS = {"train_loss_mean": "training loss (mean since the last print)", "eval_loss": "evaluation loss",
          "eval_acc": "evaluation accuracy"}


@probe("dist-metric", title="Printed metrics reduced over the ranks", outcomes={
    "ok": "the printed figures that could be traced are the global ones",
    "not-reduced": "a printed loss or metric is one rank's own figure where the global one differs",
    "summed": "a printed figure is the sum over the ranks, not their mean",
    "per-rank": "every rank printed its own, different figure at the same line"})
@across_ranks
def dist_metric(ctx: ProbeContext, run) -> ProbeResult:
    prints = {r: [p for p in d.get("prints", []) if _numbers(p["text"])] for r, d in run.digests.items()}
    if not any(prints.values()):
        return skipped("the script printed no figures with decimals")
    by_site: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r, ps in prints.items():
        for p in ps:
            by_site[p["where"]][r].append(p)
    traced, findings = [], []
    for site, per_rank in by_site.items():
        printers = sorted(per_rank)
        if len(printers) > 1:
            first = {r: per_rank[r][-1] for r in printers}
            texts = {r: p["text"] for r, p in first.items()}
            if len(set(texts.values())) > 1 and all(len(_numbers(t)) == len(_numbers(texts[printers[0]])) for t in texts.values()):
                shown = "; ".join(f"rank {r}: {t[:80]!r}" for r, t in list(texts.items())[:3])
                findings.append(("per-rank", f"every rank printed its own figures at {site}, and they differ ({shown})",
                                 site))
            continue
        rank = printers[0]
        tally: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))   # key -> kind -> sentences
        last_step = -1
        for p in per_rank[rank]:
            lo, hi = last_step, p["step"]
            last_step = hi
            windows = {r: _window(d, lo, hi) for r, d in run.digests.items()}
            mine = windows[rank]
            for printed in _numbers(p["text"]):
                for key in ("eval_acc", "eval_loss", "train_loss_mean"):
                    local = mine.get(key)
                    glob = _global(windows, key)
                    if local is None or not glob or glob.get("mean") is None:
                        continue
                    if _matches(printed, glob["mean"]):
                        tally[key]["global"].append(hi)
                        break
                    if _matches(printed, local):
                        tally[key]["local"].append(f"rank {rank} printed {p['text'][:100]!r} at {site} (step {hi}): "
                                                   f"{printed[0]:g} is rank {rank}'s own {LABELS[key]} ({local:.4g}); "
                                                   f"over all {run.world} ranks it was {glob['mean']:.4g}")
                        break
                    if run.world > 1 and _matches(printed, glob["sum"]):
                        tally[key]["summed"].append(f"rank {rank} printed {p['text'][:100]!r} at {site} (step {hi}): "
                                                    f"{printed[0]:g} is the sum of the ranks' {LABELS[key]} "
                                                    f"({glob['sum']:.4g}); their mean was {glob['mean']:.4g}")
                        break
        for key, kinds in tally.items():
            # a figure is read as one rank's own only when no print of it at this line matched the global value
            if kinds["global"]:
                traced.append((site, key, "global"))
            elif kinds["local"]:
                findings.append(("not-reduced", kinds["local"][-1] + (f" (and at {len(kinds['local']) - 1} earlier "
                                 f"print(s) of this line)" if len(kinds["local"]) > 1 else ""), site))
            elif kinds["summed"]:
                findings.append(("summed", kinds["summed"][-1], site))
    if findings:
        kind, text, site = findings[0]
        fix = (f"reduce the figure over the ranks before {site} prints it: put its numerator and count in a tensor, "
               f"dist.all_reduce(t, op=dist.ReduceOp.SUM), then divide (a mean over ranks: divide the summed value by "
               f"dist.get_world_size())")
        return failed(kind, text + (f" ({len(findings) - 1} more such line(s))" if len(findings) > 1 else ""),
                      findings=[t for _, t, _ in findings[:6]], fix_here=fix)
    if traced:
        return passed(f"{len(traced)} printed figure(s) traced to the global value over all {run.world} ranks "
                      f"({', '.join(sorted({LABELS[k] for _, k, _ in traced}))})")
    return skipped("no printed figure could be traced to a loss or accuracy the ranks computed")


# -------------------------------------------------------------------------------------------- writes
@probe("dist-writes", title="Files written by several ranks", outcomes={
    "ok": "no file was written by more than one rank",
    "conflict": "several ranks wrote the same file"})
@across_ranks
def dist_writes(ctx: ProbeContext, run) -> ProbeResult:
    writers: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r, d in run.digests.items():
        for w in d.get("writes", []):
            writers[w["path"]][r].append(w)
    if not writers:
        return passed("the script wrote no file")
    shared = {path: ranks for path, ranks in writers.items() if len(ranks) > 1}
    if not shared:
        return passed(f"{len(writers)} file(s) written, each by one rank")
    path, ranks = sorted(shared.items(), key=lambda kv: -len(kv[1]))[0]
    first = next(iter(ranks.values()))[0]
    name = path.rsplit("/", 1)[-1]
    how = f"{first['via']} at {first['where']}"
    times = max(len(v) for v in ranks.values())
    text = (f"{_ranks(ranks)} all wrote {name} ({how}, {times} time(s) each)"
            + (f"; {len(shared) - 1} more file(s) written by several ranks" if len(shared) > 1 else "")
            + ": they overwrite one another (a torn file when two writes overlap)")
    fix = (f"write {name} from one rank: `if dist.get_rank() == 0:` around the {first['via']} at {first['where']} "
           f"(and dist.barrier() before other ranks read it), or put the rank in the file name")
    return failed("conflict", text, files=sorted(shared)[:10], fix_here=fix)


# ------------------------------------------------------------------------------------------ replicas
def _differs(a: list | None, b: list | None) -> float | None:
    """The relative difference of two parameter fingerprints (None when not comparable)."""
    if not a or not b or a[0] != b[0]:
        return None
    worst = 0.0
    for x, y in zip(a[1:], b[1:]):
        if not isinstance(x, (int, float)) or not isinstance(y, (int, float)):
            continue
        worst = max(worst, abs(x - y) / max(abs(x), abs(y), 1e-12))
    return worst


@probe("dist-replicas", title="The replicas' parameters stay identical", outcomes={
    "ok": "after every compared step the ranks held the same parameters",
    "diverged": "the ranks' parameters differ after a step",
    "not-broadcast": "the ranks started from different parameters"})
@across_ranks
def dist_replicas(ctx: ProbeContext, run) -> ProbeResult:
    ranks = run.ranks
    from nnwizard.probes._crash import DDP_UNUSED

    if any(DDP_UNUSED in (run.error(r) or {}).get("message", "") for r in ranks):
        return skipped("DistributedDataParallel's reducer never finished a reduction (parameters without a gradient, "
                       "dist-unused-params): the replicas' gradients were never averaged, so they differ by that fault")
    fps = {r: {(p["step"], p["opt"]): p["fp"] for p in d.get("params", [])} for r, d in run.digests.items()}
    common = sorted(set.intersection(*(set(f) for f in fps.values()))) if fps else []
    if not common:
        return skipped("no optimizer step was recorded on every rank")
    names = run.digests[ranks[0]].get("param_names", {})
    compared = 0
    for key in common:
        step, opt = key
        base = fps[ranks[0]][key]
        worst = []
        for r in ranks[1:]:
            for i, (a, b) in enumerate(zip(base, fps[r][key])):
                diff = _differs(a, b)
                if diff is None:
                    continue
                compared += 1
                if diff > PARAM_RTOL:
                    worst.append((diff, i, r))
        if not worst:
            continue
        worst.sort(reverse=True)
        tensor_names = names.get(str(opt), [])
        shown = ", ".join(f"{tensor_names[i] if i < len(tensor_names) else f'tensor {i}'} "
                          f"(rank {r} vs rank {ranks[0]}: {d:.2g} relative)" for d, i, r in worst[:3])
        cause, fix = _divergence_cause(run, step)
        if step == 0:
            return failed("not-broadcast", f"before the first step the ranks already held different parameters: {shown}"
                                           f"{cause}", step=0, fix_here=fix)
        return failed("diverged", f"after step {step} the ranks' parameters differ: {shown} ({len(worst)} tensor(s) "
                                  f"differ){cause}", step=step, fix_here=fix)
    if not compared:
        return skipped("every parameter is sharded across the ranks (FSDP): no replica to compare")
    return passed(f"the ranks held identical parameters at all {len(common)} compared steps (up to step {common[-1][0]})")


def _divergence_cause(run, step: int) -> tuple[str, str]:
    base = run.digests[run.ranks[0]]
    ddps = base.get("ddp", [])
    if not ddps and not base.get("fsdp"):
        return ("; no DistributedDataParallel (or FSDP) wraps the model, so each rank trains its own replica on its own "
                "batches and nothing averages the gradients",
                "wrap the model in DistributedDataParallel after moving it to its device, and train through the wrapper "
                "(or all-reduce the gradients and divide by the world size before optimizer.step())")
    idle = [w for w in ddps if w.get("forwards", 0) == 0]
    if idle:
        w = idle[0]
        return (f"; the DistributedDataParallel built at {w.get('where') or '?'} never ran a forward: the training "
                f"forwards call {w.get('model')} directly, so DDP never averages the gradients",
                f"call the DistributedDataParallel wrapper built at {w.get('where') or '?'} in the training loop, not the "
                f"module it wraps (ddp_model(x), not model(x))")
    lrs = {r: next((s[2] for s in d.get("steps", []) if s[0] == step), None) for r, d in run.digests.items()}
    if len({str(v) for v in lrs.values() if v is not None}) > 1:
        shown = ", ".join(f"rank {r}: {v}" for r, v in lrs.items())
        return (f"; the ranks' learning rates differ at that step ({shown})",
                "step the schedulers and optimizers on every rank alike (no rank-dependent lr or scheduler.step())")
    return "", ("keep the replicas in step: every update must follow the averaged gradients on every rank (no "
                "rank-dependent update, no parameter edited on one rank only)")
