"""Modules whose weights live on dtrain's parameter servers.

    emb = dtrain.nn.SparseEmbedding("deep", 8, optimizer="adagrad", learning_rate=0.05,
                                    initializer="uniform", init_a=-0.05, init_b=0.05)
    rows = emb(ids)            # ids: int64, any shape -> ids.shape + (8,), with autograd

The table is the C++ Fleet API's SparseEmbedding (dtrain/fleet/ps.h): forward
pulls each distinct id of the batch once, the gradients gathered by backward
are pushed by the PS optimizer's step() (fleet.distributed_optimizer), left in
flight in async mode with a_sync_configs' send_queue_size, and prefetch()
pulls the next batch's rows while this one trains. The GIL is released while
the table waits on the network.
"""

import weakref

import torch

from dtrain import _ext, _toml

__all__ = ["SparseEmbedding"]

# Every SparseEmbedding of this process, in creation order: fleet.init_worker()
# declares their tables, the PS optimizer's step() pushes their gradients.
_embeddings = []


def _live_embeddings():
    alive = [e() for e in _embeddings]
    _embeddings[:] = [weakref.ref(e) for e in alive if e is not None]
    return [e for e in alive if e is not None]


def _table_toml(name, keys):
    return _toml.table(f"ps.tables.{name}", keys)


class SparseEmbedding(torch.nn.Module):
    """An embedding of unbounded int64 ids whose rows live in the sparse table `name`.

    Keyword arguments are the table's [ps.tables.<name>] keys (docs/ps.md):
    optimizer, learning_rate, beta1, beta2, epsilon, initial_g2sum,
    initializer, init_a, init_b, seed, admit_count, admit_probability,
    decay_rate, nonclk_coeff, click_coeff, delete_threshold,
    delete_after_unseen_days. A rule not given here is the one of
    fleet.distributed_optimizer's optimizer, as in Paddle. Every worker must
    declare the table alike; a different declaration is refused naming the
    field.

    padding_idx: an id that gets a zero row, is not pulled and gets no
    gradient (Paddle's padding_idx; use it for missing values).
    """

    def __init__(self, name, embedding_dim, padding_idx=None, **table):
        super().__init__()
        if not isinstance(name, str) or not name or "." in name:
            raise ValueError(f"SparseEmbedding: the table name must be a non-empty string without '.', got {name!r}")
        if "dim" in table:
            raise TypeError("SparseEmbedding: give the width as embedding_dim, not dim")
        self.name = name
        self.embedding_dim = int(embedding_dim)
        self.padding_idx = padding_idx
        self._keys = {"kind": "sparse", "dim": self.embedding_dim, **table}
        self._table = None
        _embeddings.append(weakref.ref(self))

    def extra_repr(self):
        return f"'{self.name}', {self.embedding_dim}" + (
            f", padding_idx={self.padding_idx}" if self.padding_idx is not None else "")

    def _declare(self, rule):
        """Declares the table on the servers (fleet.init_worker); rule: the optimizer's keys."""
        if self._table is None:
            keys = {**rule, **self._keys} if "optimizer" not in self._keys else dict(self._keys)
            self._table = _ext.load().ps.SparseTable(self.name, _table_toml(self.name, keys))
        return self._table

    def _cpp(self, what):
        if self._table is None:
            from dtrain.fleet import ps as _ps
            _ps.declare_tables(f"SparseEmbedding '{self.name}'.{what}")
        return self._table

    def _kept(self, ids):
        return None if self.padding_idx is None else ids != self.padding_idx

    def forward(self, ids, show_click=None):
        """Rows of ids (int64, any shape): ids.shape + (embedding_dim,), float32.

        show_click: float, ids.numel() x 2 (optional), feeds the table's show and click counters.
        """
        self._cpp("forward")
        keep = self._kept(ids)
        if keep is None:
            if show_click is None:
                return self._table.forward(ids)
            return self._table.forward_show_click(ids, show_click)
        rows = self._table.forward(ids[keep]) if show_click is None else \
            self._table.forward_show_click(ids[keep], show_click.reshape(-1, 2)[keep.reshape(-1)])
        out = torch.zeros(ids.shape + (self.embedding_dim,), dtype=torch.float32)
        out[keep] = rows
        return out

    def prefetch(self, next_ids):
        """Starts pulling the rows of the next batch's ids (async mode with send_queue_size > 0)."""
        keep = self._kept(next_ids)
        self._cpp("prefetch").prefetch(next_ids if keep is None else next_ids[keep])

    def flush(self):
        """Waits for this table's pushes in flight."""
        self._cpp("flush").flush()

    def clear(self):
        """Drops the gradients gathered since the last step without pushing them (after an evaluation)."""
        if self._table is not None:
            self._table.clear()
