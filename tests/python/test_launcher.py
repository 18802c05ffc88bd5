"""dtrain runs Python programs: the interpreter, torchrun's variables, -m, --no_python, --local_rank_arg."""

import json
import os
import stat
import sys

from harness import BUILD, rank_script, run_dtrain


def dumps(path):
    return {name[:-5]: json.load(open(os.path.join(path, name))) for name in os.listdir(path)
            if name.endswith(".json")}


def test_torchrun_variables(tmp_path):
    port = 20000 + os.getpid() % 20000
    rc, out, err = run_dtrain(["--nproc_per_node", "2", "--start_port", str(port), "--max_restarts", "1",
                               "--job_id", "pyjob", "--log_dir", str(tmp_path / "log"), rank_script("env_dump.py")],
                              env={"ENV_DUMP_DIR": str(tmp_path), "PYTHONPATH": "", "OMP_NUM_THREADS": ""})
    assert rc == 0, err
    assert "python           /usr/bin/python3" in out or "python           " + sys.executable in out, out
    assert "OMP_NUM_THREADS=1 for each of the 2 processes" in out
    d = dumps(tmp_path)
    for r in (0, 1):
        e = d[f"TRAINER.{r}"]["env"]
        assert e["RANK"] == str(r) and e["WORLD_SIZE"] == "2" and e["LOCAL_RANK"] == str(r)
        assert e["LOCAL_WORLD_SIZE"] == "2" and e["GROUP_RANK"] == "0" and e["GROUP_WORLD_SIZE"] == "1"
        assert e["ROLE_RANK"] == str(r) and e["ROLE_WORLD_SIZE"] == "2" and e["ROLE_NAME"] == "default"
        assert e["MASTER_ADDR"] == "127.0.0.1"
        assert port < int(e["MASTER_PORT"]) < port + 3, "MASTER_PORT is worker 0's endpoint, in the range"
        assert e["TORCHELASTIC_RESTART_COUNT"] == "0" and e["TORCHELASTIC_MAX_RESTARTS"] == "1"
        assert e["TORCHELASTIC_RUN_ID"] == "pyjob" and e["TORCHELASTIC_ERROR_FILE"].endswith(".torch.json")
        assert e["OMP_NUM_THREADS"] == "1" and e["GLOO_SOCKET_IFNAME"] == "lo"
        assert e["PYTHONPATH"].endswith(os.path.join("lib", "dtrain", "python")), e["PYTHONPATH"]
        assert d[f"TRAINER.{r}"]["argv"][1:] == []
    lo, hi = map(int, d["TRAINER.0"]["env"]["DTRAIN_PORT_RANGE"].split("-"))
    assert int(d["TRAINER.0"]["env"]["MASTER_PORT"]) not in range(lo, hi + 1)


def test_user_omp_threads_kept(tmp_path):
    rc, out, err = run_dtrain(["--nproc_per_node", "2", "--log_dir", str(tmp_path / "log"),
                               rank_script("env_dump.py")], env={"ENV_DUMP_DIR": str(tmp_path), "OMP_NUM_THREADS": "3"})
    assert rc == 0, err
    assert "OMP_NUM_THREADS=1" not in out
    assert dumps(tmp_path)["TRAINER.1"]["env"]["OMP_NUM_THREADS"] == "3"


def test_module_no_python_local_rank_and_python(tmp_path):
    env = {"ENV_DUMP_DIR": str(tmp_path)}
    rc, out, err = run_dtrain(["--nproc_per_node", "2", "--local_rank_arg", "--log_dir", str(tmp_path / "l1"),
                               "-m", "env_dump", "x"], env=env, cwd=os.path.dirname(rank_script("env_dump.py")))
    assert rc == 0, err
    d = dumps(tmp_path)
    assert d["TRAINER.1"]["argv"][1:] == ["x", "--local_rank=1"], d["TRAINER.1"]["argv"]

    script = tmp_path / "direct.py"
    script.write_text(f"#!{sys.executable}\n" + open(rank_script("env_dump.py")).read())
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    rc, out, err = run_dtrain(["--no_python", "--log_dir", str(tmp_path / "l2"), str(script)], env=env)
    assert rc == 0, err
    assert "python " not in out  # no interpreter row: run as it is

    rc, out, err = run_dtrain(["--python", "/nonexistent/python3", "--log_dir", str(tmp_path / "l3"),
                               rank_script("env_dump.py")], env=env)
    assert rc != 0 and "/nonexistent/python3" in out + err
    rc, out, err = run_dtrain(["--log_dir", str(tmp_path / "l4"), str(tmp_path / "missing.py")], env=env)
    assert rc == 2 and "missing.py: no such file" in err, err


def test_ps_job_workers_form_their_own_group(tmp_path):
    """Servers get no torchrun variables; the workers are ranks 0..W-1 of a world of W."""
    server = os.path.join(BUILD, "bin", "dtrain-ps-linear")
    toml = os.path.join(os.path.dirname(BUILD), "examples", "ps_linear", "ps_linear.toml")
    if not os.path.exists(toml):
        toml = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "ps_linear",
                            "ps_linear.toml")
    prog = (f'if [ "$TRAINING_ROLE" = PSERVER ]; then {sys.executable} {rank_script("env_dump.py")} && '
            f'exec {server} {toml}; else exec {sys.executable} {rank_script("env_dump.py")}; fi')
    rc, out, err = run_dtrain(["--server_num", "1", "--worker_num", "2", "--log_dir", str(tmp_path / "log"),
                               "--", "bash", "-c", prog], env={"ENV_DUMP_DIR": str(tmp_path)})
    assert rc == 0, err + out
    d = dumps(tmp_path)
    assert d["PSERVER.0"]["env"]["RANK"] is None and d["PSERVER.0"]["env"]["MASTER_PORT"] is None
    for r in (0, 1):
        e = d[f"TRAINER.{r}"]["env"]
        assert e["RANK"] == str(r) and e["WORLD_SIZE"] == "2" and e["LOCAL_WORLD_SIZE"] == "2"
