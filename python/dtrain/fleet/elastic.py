"""Elastic training's in-memory commit for a Python program under `dtrain --nnodes MIN:MAX`.

Horovod's ``state.commit()``: after each complete optimizer step, ``commit()``
keeps the model, the optimizer and the program's own state in this machine's
commit folder (``DTRAIN_ELASTIC_DIR``, in /dev/shm, kept by dtrain across
generations). When a machine is lost or joins, dtrain starts the workers of the
next generation at the new world size; ``restore()`` then gives every rank the
newest commit among the machines, sent by the lowest rank that holds it (a
joining machine gets it too). A step cut short by a lost peer is never
committed: at most the step in flight is redone. docs/elastic.md.

    from dtrain.fleet.elastic import ElasticState
    elastic = ElasticState()
    step, extra = elastic.restore(model, optimizer) or (0, None)
    for step in range(step, steps):
        ...
        optimizer.step()
        elastic.commit(model, optimizer, step + 1, extra={"epoch": epoch})

The C++ Fleet API's dtrain::fleet::ElasticState is the same for libtorch
programs; the two do not read each other's commits.
"""

import io
import os

import torch
import torch.distributed as dist

__all__ = ["ElasticState"]


class ElasticState:
    """The commit folder of this machine; disabled (commit() does nothing) outside an elastic job."""

    def __init__(self):
        self.dir = os.environ.get("DTRAIN_ELASTIC_DIR", "")
        self.generation = int(os.environ.get("DTRAIN_RESTART_COUNT", "0"))
        self._local_rank = int(os.environ.get("DTRAIN_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0")))

    @property
    def enabled(self):
        return bool(self.dir)

    def _path(self, name):
        return os.path.join(self.dir, name)

    def commit(self, model, optimizer, step, extra=None):
        """Local rank 0 writes the state atomically (a temporary file, then a rename); not collective."""
        if not self.enabled or self._local_rank != 0:
            return
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": int(step),
                    "extra": extra}, buf)
        for name, data in (("commit.py.pt", buf.getvalue()), ("step", f"{self.generation} {int(step)}\n".encode())):
            tmp = self._path(name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, self._path(name))

    def restore(self, model, optimizer, group=None):
        """Collective over group (default: the world; none initialized: this process alone).

        Loads the newest commit on any rank's machine into model and optimizer and
        returns (step, extra); None when no machine holds one (the first generation).
        """
        state = None
        path = self._path("commit.py.pt")
        if self.enabled and os.path.exists(path):
            state = torch.load(path, map_location="cpu")
        mine = state["step"] if state is not None else -1
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
            steps = [None] * dist.get_world_size(group)
            dist.all_gather_object(steps, mine, group=group)
            newest = max(steps)
            if newest < 0:
                return None
            root = steps.index(newest)
            if group is not None:
                root = dist.get_global_rank(group, root)
            box = [state if dist.get_rank() == root else None]
            dist.broadcast_object_list(box, src=root, group=group)
            state = box[0]
        elif state is None:
            return None
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        return state["step"], state["extra"]
