"""Rank 1 raises inside torch's @record: its traceback goes to TORCHELASTIC_ERROR_FILE."""

import os
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    if os.environ["RANK"] == "1":
        raise ValueError("bad batch 7 in shard 1")
    time.sleep(30)


if __name__ == "__main__":
    main()
