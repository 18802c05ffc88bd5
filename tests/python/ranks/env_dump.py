"""Writes this process's view of the launcher's contract (variables and arguments) as JSON."""

import json
import os
import sys

NAMES = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
         "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
         "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS",
         "GLOO_SOCKET_IFNAME", "DTRAIN_PORT_RANGE", "DTRAIN_RANK", "TRAINING_ROLE", "PADDLE_TRAINER_ID",
         "PYTHONPATH"]
out = os.environ.get("ENV_DUMP_DIR", ".")
index = os.environ.get("DTRAIN_RANK", os.environ.get("DTRAIN_SERVER_INDEX"))
who = f"{os.environ.get('TRAINING_ROLE', 'TRAINER')}.{index}"
import dtrain  # noqa: E402,F401  (importable with no PYTHONPATH of the user's)
with open(os.path.join(out, who + ".json"), "w") as f:
    json.dump({"env": {n: os.environ.get(n) for n in NAMES}, "argv": sys.argv, "executable": sys.executable}, f)
