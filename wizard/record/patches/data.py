"""Patches on data loading: ``DataLoader.__iter__`` wraps each pass's iterator (:class:`LoaderIter`), which
counts batches and passes (``LoaderInfo``), caps the batches per pass (``Recorder.limit_batches``), may replace
every batch (``Recorder.replace_batch``), numbers the steps by pass and batch, and tells the listeners
(``on_batch``). Full mode runs every DataLoader with 0 worker processes (the recorder must see the batches in
this process; a note says so) and pauses the graph mode while a batch is fetched."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable

from torch.utils.data import DataLoader

from nnwizard.record.models import FETCH_CODES

if TYPE_CHECKING:  # pragma: no cover
    from nnwizard.record.full import FullPolicy
    from nnwizard.record.recorder import Recorder


def loaders(rec: "Recorder", full: "FullPolicy | None" = None) -> None:
    """``DataLoader.__iter__``; ``full``: the full policy (0 workers, the graph mode paused, each batch told to
    ``full.batch_fetched`` before it is replaced and counted and to ``full.batch_served`` after)."""
    def make(original):
        if full is None:
            @functools.wraps(original)
            def __iter__(this):
                return LoaderIter(rec, this, original(this))
            return __iter__

        graph = full.graph

        @functools.wraps(original)
        def __iter__(this):
            if getattr(this, "num_workers", 0) > 0:
                workers = this.num_workers
                rec.on_exit(functools.partial(_restore_workers, this, workers))
                rec.recording.notes.append(f"DataLoader num_workers={workers} ran with 0 workers while recorded")
                this.num_workers = 0
            graph.pause()   # (the iterator's set-up draws its seed with torch ops)
            try:
                return PausedLoaderIter(rec, this, original(this), full.batch_fetched, full.batch_served)
            finally:
                graph.resume()
        return __iter__

    rec.patch(DataLoader, "__iter__", make)


def _restore_workers(loader, workers: int) -> None:
    try:
        loader.num_workers = workers
    except Exception:  # noqa: BLE001
        pass


class LoaderIter:
    """Wraps a DataLoader iterator: counts batches, caps them per epoch, may replace each batch."""

    def __init__(self, rec: "Recorder", loader: DataLoader, inner, fetched: Callable[[], None] | None = None,
                 served: Callable[[Any], None] | None = None):
        self.rec, self.inner, self.fetched, self.served = rec, inner, fetched, served
        self.info = rec.loader_info(loader)
        self.info.iterations += 1
        self.info.batches.append(0)
        self.info.backwards.append(0)
        self.count = 0
        self.done = False
        # its epoch: 1 + the earlier passes over this loader that trained (an evaluation pass over it does not count)
        self.epoch = 1 + sum(1 for b in self.info.backwards[:-1] if b > 0)
        rec.loader_stack.append(self.info)

    def __iter__(self):
        return self

    def __len__(self):
        return len(self.inner)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __next__(self):
        return self._next()

    def _close(self) -> None:
        if not self.done:
            self.done = True
            stack = self.rec.loader_stack
            if self.info in stack:
                stack.remove(self.info)

    def _capped(self) -> bool:
        """Does the batch cap end this pass? A training pass, always; an evaluation pass (no backward so
        far) unless the recorder's ``cap_evaluation`` is off (a rerun after a crash that may be the cap's)."""
        rec = self.rec
        if self.info.backwards[-1]:
            return True
        rec.evaluation_capped = rec.evaluation_capped or rec.cap_evaluation
        return rec.cap_evaluation

    def _next(self):
        rec = self.rec
        if rec.limit_batches is not None and self.count >= rec.limit_batches and self._capped():
            if self.info.backwards[-1] and not self.done:
                rec.recording.capped_training += 1
            self._close()
            raise StopIteration
        try:
            batch = next(self.inner)
        except StopIteration:
            self._close()
            raise
        rec.fetches += 1
        stack = rec.loader_stack
        if self.done:  # the epoch re-entered after a cap: count it again
            self.done = False
            stack.append(self.info)
        elif not stack or stack[-1] is not self.info:
            # the loader that last served a batch is the one under way: another's pass left unfinished (Lightning's
            # sanity check takes 2 validation batches, a loop that breaks early) must not take this one's forwards
            # and backwards
            if self.info in stack:
                stack.remove(self.info)
            stack.append(self.info)
        if self.fetched is not None:
            self.fetched()
        if rec.replace_batch is not None:
            batch = rec.replace_batch(batch, self.count)
        rec.epoch, rec.batch_index = self.epoch, self.count
        self.count += 1
        self.info.batches[-1] = self.count
        if self.served is not None:
            self.served(batch)
        if rec.listening:
            rec.notify("on_batch", batch, self.count - 1)
        rec.check_time()
        return batch


class PausedLoaderIter(LoaderIter):
    """Full mode: the graph mode is off the stack while a batch is fetched."""

    def __next__(self):
        graph = self.rec.policy.graph
        graph.pause()
        try:
            return self._next()
        finally:
            graph.resume()


FETCH_CODES.update({LoaderIter._next.__code__, LoaderIter.__next__.__code__, PausedLoaderIter.__next__.__code__})
