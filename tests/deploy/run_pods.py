#!/usr/bin/python3
"""Runs the pods of a deploy/ manifest as processes in network namespaces.

There is no cluster here, so this plays the operator: it reads the manifest
with a real YAML parser (python3-yaml), makes one network namespace per pod on
one bridge, gives each pod the names its operator's DNS would (through the
namespace's /etc/netns/NS/hosts) and the environment variables its operator
documents (docs/deploy.md names the source of each), mounts the Secret's keys
as files (mode from defaultMode), expands $(VAR) in command and args as the
kubelet does, and runs every pod's container command at once. The image's
paths map to this checkout: /opt/dtrain/apps -> SRC/apps, /tmp -> the pod's
folder, programs from BIN.

  run_pods.py MANIFEST --src SRC --bin BIN --run conformance|cls|cls-kill|ctr
              [--replicas N] [--timeout S]

--run conformance replaces the job file with dtrain-conformance (every pod's
workers must print "N passed, 0 failed"); --run cls and --run ctr keep the job
file and shorten it with -o overrides (a worker must print its evaluation). Exit 0
when every pod exits 0 and the check holds; 77 without root.

--run cls-kill is for elastic jobs: a cls run logging every step; once node 0
(the pod that prints "elastic generation 0: ...") has logged 8 steps, every
process of the last other pod gets SIGKILL, as a lost machine. Every other pod
must exit 0, node 0 must name the lost pod and print generation 1 without it,
and a worker must print its evaluation. The lost pod is not started again.

A PyTorchJob with an elasticPolicy runs maxReplicas Worker pods, as its
autoscaler would at its top; --replicas N runs N Worker pods instead (PaddleJob
and PyTorchJob), with the variables the operator derives from that count.
"""
import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import yaml

CONFORMANCE = ["dtrain-conformance", "--backend", "gloo", "--large-count", "100003", "--filter", "allreduce"]
# The generated click logs on a volume every pod mounts ({shared}), as a cluster's data would be.
CTR_SHORT = ["-o", "data.gen_train_lines=20000", "-o", "data.gen_test_lines=4000", "-o", "data.dir={shared}/data",
             "-o", "log.every_steps=10", "-o", "checkpoint.every_steps=0", "-o", "ps.checkpoint_dir=ps"]
CLS_SHORT = ["-o", "data.limit_train=1024", "-o", "data.limit_eval=500", "-o", "train.epochs=1",
             "-o", "train.batch_size=64", "-o", "train.eval_batch_size=250", "-o", "checkpoint.every_epochs=0"]
# 1,536 images, 16 per worker, a line per step: 32 steps at 3 pods x 1 worker, room to lose a pod at step 8.
CLS_KILL = ["-o", "data.limit_train=1536", "-o", "data.limit_eval=256", "-o", "train.epochs=1",
            "-o", "train.batch_size=16", "-o", "train.eval_batch_size=256", "-o", "train.warmup_epochs=0",
            "-o", "log.every_steps=1", "-o", "checkpoint.every_epochs=0", "-o", "checkpoint.resume=false"]
KILL_AT_STEP = 8


def sh(*cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def port_named(container, name, default):
    for p in container.get("ports", []):
        if p.get("name") == name:
            return p["containerPort"]
    return default


class Pod:
    def __init__(self, name, spec, env, dns=()):
        self.name, self.spec, self.env, self.dns = name, spec, dict(env), list(dns)
        self.container = spec["containers"][0]


def replica_counts(specs, workers):
    # The pods of each replica type; `workers` (when not None) replaces the Worker replicas, as a scale would.
    counts = {rtype: spec["replicas"] for rtype, spec in specs.items()}
    if workers is not None:
        if "Worker" not in specs:
            raise SystemExit("run_pods: --replicas: the job has no Worker replicas")
        counts["Worker"] = workers
    return counts


def paddlejob_pods(job, workers=None):
    """training-operator pkg/controller.v1/paddlepaddle/envvar.go: collective (Worker replicas only), or
    parameter-server mode (Master replicas run servers, Workers trainers). A PaddleJob's elasticPolicy sets
    no variable there: PADDLE_NNODES is the number of pods."""
    name = job["metadata"]["name"]
    specs = job["spec"]["paddleReplicaSpecs"]
    counts = replica_counts(specs, workers)
    total = sum(counts.values())
    ps = "Master" in specs
    rendezvous = "Master" if ps else "Worker"
    port = port_named(specs[rendezvous]["template"]["spec"]["containers"][0], "master", 36543)
    pods = []
    for rtype in ("Master", "Worker"):
        if rtype not in specs:
            continue
        for i in range(counts[rtype]):
            env = {"PADDLE_JOB_ID": name, "PADDLE_NNODES": str(total), "PYTHONUNBUFFERED": "0"}
            # The rendezvous pod 0 gets its own pod IP (POD_IP_DUMMY), the others its service name.
            own = rtype == rendezvous and i == 0
            env["PADDLE_MASTER"] = ("$(POD_IP_DUMMY):%d" % port if own
                                    else "%s-%s-0:%d" % (name, rendezvous.lower(), port))
            if ps:
                env["PADDLE_SERVER_NUM" if rtype == "Master" else "PADDLE_TRAINER_NUM"] = "1"
            pods.append(Pod("%s-%s-%d" % (name, rtype.lower(), i), specs[rtype]["template"]["spec"], env))
    return pods


def pytorch_port(spec):
    # The port named "pytorchjob-port" of the container named "pytorch" (23456 when unnamed: the defaults).
    for c in spec["template"]["spec"]["containers"]:
        if c.get("name") == "pytorch":
            return port_named(c, "pytorchjob-port", 23456)
    raise SystemExit("run_pods: a PyTorchJob's replicas need a container named pytorch")


def pytorch_elastic_env(job):
    """pkg/controller.v1/pytorch/elastic.go (torchrun's PET_* variables), on the elasticPolicy as
    pytorch_defaults.go completes it: minReplicas and maxReplicas from each other, else the Worker replicas.
    Returns the variables and maxReplicas."""
    name = job["metadata"]["name"]
    policy = job["spec"]["elasticPolicy"] or {}
    specs = job["spec"]["pytorchReplicaSpecs"]
    if "Worker" not in specs:
        raise SystemExit("run_pods: an elastic PyTorchJob needs Worker replicas (the webhook refuses it)")
    low = policy.get("minReplicas", policy.get("maxReplicas", specs["Worker"]["replicas"]))
    high = policy.get("maxReplicas", low)
    host = policy.get("rdzvHost", "%s-worker-0" % name)
    port = policy["rdzvPort"] if "rdzvPort" in policy else pytorch_port(specs["Worker"])
    env = {"PET_RDZV_ENDPOINT": "%s:%d" % (host, port), "PET_RDZV_BACKEND": policy.get("rdzvBackend", "c10d"),
           "PET_NNODES": "%d:%d" % (low, high)}
    if "maxRestarts" in policy:
        env["PET_MAX_RESTARTS"] = str(policy["maxRestarts"])
    if "nProcPerNode" in policy:
        env["PET_NPROC_PER_NODE"] = str(policy["nProcPerNode"])
    if "rdzvId" in policy:
        env["PET_RDZV_ID"] = policy["rdzvId"]
    if policy.get("rdzvConf"):
        env["PET_RDZV_CONF"] = ",".join("%s=%s" % (c["key"], c["value"]) for c in policy["rdzvConf"])
    if policy.get("standalone"):
        env["PET_STANDALONE"] = ""
    return env, high


def pytorchjob_pods(job, workers=None):
    """training-operator pkg/controller.v1/pytorch/envvar.go and master.go; elastic.go with an elasticPolicy."""
    name = job["metadata"]["name"]
    specs = job["spec"]["pytorchReplicaSpecs"]
    common = {"PYTHONUNBUFFERED": "0"}
    if "nprocPerNode" in job["spec"]:
        common["PET_NPROC_PER_NODE"] = str(job["spec"]["nprocPerNode"])
    if "elasticPolicy" in job["spec"]:
        elastic, high = pytorch_elastic_env(job)
        common.update(elastic)
        if workers is None:
            workers = high
    counts = replica_counts(specs, workers)
    total = sum(counts.values())
    master = specs.get("Master")
    pods = []
    for rtype, spec in (("master", master), ("worker", specs.get("Worker"))):
        if not spec:
            continue
        for i in range(counts[rtype.capitalize()]):
            env = dict(common)
            if master:
                env.update({"MASTER_ADDR": "%s-master-0" % name, "MASTER_PORT": str(pytorch_port(master)),
                            "WORLD_SIZE": str(total), "RANK": str(i + (1 if rtype == "worker" else 0))})
            pods.append(Pod("%s-%s-%d" % (name, rtype, i), spec["template"]["spec"], env))
    return pods


def indexed_job_pods(job, workers=None):
    """Kubernetes Indexed Job: JOB_COMPLETION_INDEX, hostname NAME-i, DNS NAME-i.SUBDOMAIN."""
    name = job["metadata"]["name"]
    if job["spec"].get("completionMode") != "Indexed":
        raise SystemExit("run_pods: the Job is not Indexed")
    if workers is not None:
        raise SystemExit("run_pods: --replicas is for a PaddleJob's or PyTorchJob's Worker replicas")
    spec = job["spec"]["template"]["spec"]
    sub = spec.get("subdomain")
    return [Pod("%s-%d" % (name, i), spec, {"JOB_COMPLETION_INDEX": str(i)},
                dns=["%s-%d.%s" % (name, i, sub)] if sub else [])
            for i in range(job["spec"]["completions"])]


def expand(text, env):
    # $(VAR) from the container's environment; $$ is a literal $; unknown stay as written.
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def steps_logged(pod):
    # Rank 0's progress lines so far (one per step with log.every_steps=1): its workerlog is on node 0's pod.
    try:
        with open(os.path.join(pod.root, "tmp", "log", "workerlog.0"), errors="replace") as f:
            return sum(1 for line in f if re.match(r"epoch .* step ", line))
    except OSError:
        return 0


def commit_folders(pids):
    # The elastic commit folders (DTRAIN_ELASTIC_DIR, under /dev/shm) that these processes use.
    found = set()
    for pid in pids:
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                for kv in f.read().split(b"\0"):
                    if kv.startswith(b"DTRAIN_ELASTIC_DIR="):
                        found.add(kv.split(b"=", 1)[1].decode())
        except OSError:
            pass
    return found


def lose_a_pod(pods, procs, deadline):
    """--run cls-kill: once node 0 has logged KILL_AT_STEP steps, SIGKILL every process of the last other
    pod. Returns (node 0's pod, the lost pod), or a reason why not."""
    if not any(p.elastic for p in pods):
        return "the job is not elastic (--nnodes MIN:MAX)"
    node0 = None
    while True:
        if node0 is None:
            node0 = next((p for p in pods if "elastic generation 0: " in read(p.out)), None)
        if node0 is not None and steps_logged(node0) >= KILL_AT_STEP:
            break
        if any(p.poll() is not None for p in procs):
            return "a pod ended before node 0 logged %d steps" % KILL_AT_STEP
        if time.time() > deadline:
            return "node 0 did not log %d steps in time" % KILL_AT_STEP
        time.sleep(0.1)
    lost = [p for p in pods if p is not node0][-1]
    # Every process in the pod's namespace: its dtrain and the workers it started.
    folders = set()
    for _ in range(50):
        pids = subprocess.run(["ip", "netns", "pids", lost.ns], stdout=subprocess.PIPE, text=True).stdout.split()
        if not pids:
            break
        folders |= commit_folders(pids)
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    # A lost pod's /dev/shm goes with it; here the killed dtrain's commit folder stays behind.
    for folder in folders:
        if os.path.basename(folder).startswith("dtrain-elastic."):
            shutil.rmtree(folder, ignore_errors=True)
    print("pod %s lost (SIGKILL to its processes) after %d steps on node 0 (%s)" %
          (lost.name, steps_logged(node0), node0.name))
    return node0, lost


def nnodes_of(argv, env):
    # The machine count dtrain takes: --nnodes, else PADDLE_NNODES, else PET_NNODES (apps/dtrain/main.cc).
    for i, x in enumerate(argv):
        if x == "--nnodes" and i + 1 < len(argv):
            return argv[i + 1]
        if x.startswith("--nnodes="):
            return x.split("=", 1)[1]
    return env.get("PADDLE_NNODES") or env.get("PET_NNODES") or ""


def elastic_formed(pods):
    # An elastic job (--nnodes MIN:MAX): node 0's dtrain must start generation 0 with every pod, so that
    # no pod passes alone as a job of its own.
    want = "dtrain: elastic generation 0: %d machines: " % len(pods)
    for pod in pods:
        line = [x for x in read(pod.out).splitlines() if x.startswith(want)]
        if line:
            print(line[0])
            return True
    print("no pod printed '%s...'" % want)
    return False


def elastic_went_on(node0, lost, left):
    # Node 0's dtrain names the lost pod as it ends generation 0, then starts generation 1 without it.
    out = read(node0.out)
    ended = [line for line in out.splitlines() if "elastic generation 0 ended" in line]
    if not ended or "left: " not in ended[0] or "(%s)" % lost.ip not in ended[0].split("left: ", 1)[1]:
        print("node 0 (%s) did not name %s (%s) as left\n%s" % (node0.name, lost.name, lost.ip, out[-3000:]))
        return False
    again = re.search(r"dtrain: elastic generation 1: %d machines?: .*" % left, out)
    if not again or "(%s)" % lost.ip in again.group(0):
        print("node 0 (%s) printed no generation 1 of the %d pods left\n%s" % (node0.name, left, out[-3000:]))
        return False
    print(ended[0])
    print(again.group(0))
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("manifest")
    ap.add_argument("--src", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--run", choices=["conformance", "cls", "cls-kill", "ctr"], required=True)
    ap.add_argument("--replicas", type=int, help="Worker pods (default: the manifest's; elastic: maxReplicas)")
    ap.add_argument("--timeout", type=float, default=240)
    a = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("ip"):
        print("SKIP: network namespaces need root and iproute2")
        return 77

    docs = [d for d in yaml.safe_load_all(open(a.manifest)) if d]
    secrets = {}
    for f in os.listdir(os.path.dirname(os.path.abspath(a.manifest))):
        if f.endswith(".yaml"):
            for d in yaml.safe_load_all(open(os.path.join(os.path.dirname(os.path.abspath(a.manifest)), f))):
                if d and d.get("kind") == "Secret":
                    secrets[d["metadata"]["name"]] = d
    kinds = {"PaddleJob": paddlejob_pods, "PyTorchJob": pytorchjob_pods, "Job": indexed_job_pods}
    jobs = [d for d in docs if d.get("kind") in kinds]
    if len(jobs) != 1:
        raise SystemExit("run_pods: %s holds %d jobs, expected one" % (a.manifest, len(jobs)))
    pods = kinds[jobs[0]["kind"]](jobs[0], a.replicas)
    if a.run == "cls-kill" and len(pods) < 2:
        raise SystemExit("run_pods: --run cls-kill needs at least 2 pods")

    tag = "%d%d" % (os.getpid() % 1000, random.randint(0, 99))
    sub = random.randint(20, 220)
    work = tempfile.mkdtemp(prefix="dtrain-pods.")
    sw = "dsw" + tag
    made = []
    procs = []
    try:
        sh("ip", "netns", "add", sw)
        made.append(sw)
        sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", sw, "link", "set", "br0", "up")
        hosts = ["127.0.0.1 localhost"]
        for k, pod in enumerate(pods):
            pod.ns, pod.ip = "dp%s%d" % (tag, k), "10.%d.12.%d" % (sub, k + 1)
            sh("ip", "netns", "add", pod.ns)
            made.append(pod.ns)
            va, vb = "v%s%da" % (tag, k), "v%s%db" % (tag, k)
            sh("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
            sh("ip", "link", "set", va, "netns", pod.ns)
            sh("ip", "link", "set", vb, "netns", sw)
            sh("ip", "-n", sw, "link", "set", vb, "master", "br0")
            sh("ip", "-n", sw, "link", "set", vb, "up")
            sh("ip", "-n", pod.ns, "addr", "add", pod.ip + "/24", "dev", va)
            sh("ip", "-n", pod.ns, "link", "set", va, "up")
            sh("ip", "-n", pod.ns, "link", "set", "lo", "up")
            hosts.append("%s %s %s" % (pod.ip, pod.name, " ".join(pod.dns)))
        for pod in pods:
            os.makedirs("/etc/netns/" + pod.ns, exist_ok=True)
            with open("/etc/netns/%s/hosts" % pod.ns, "w") as f:
                # The pod's own host name is its IP, as in a pod's /etc/hosts.
                f.write("\n".join(hosts + ["%s %s" % (pod.ip, os.uname().nodename)]) + "\n")

        for pod in pods:
            root = pod.root = os.path.join(work, pod.name)
            os.makedirs(os.path.join(root, "tmp"))
            env = {"PATH": a.bin + ":/usr/bin:/bin", "HOME": root, "POD_IP_DUMMY": pod.ip}
            env.update(pod.env)
            env.update({e["name"]: e.get("value", "") for e in pod.container.get("env", [])})
            env = {k: expand(v, env) for k, v in env.items()}
            mounts = {}
            volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
            for m in pod.container.get("volumeMounts", []):
                vol = volumes[m["name"]]
                where = os.path.join(root, "mnt", m["name"])
                os.makedirs(where)
                if "secret" in vol:
                    sec = secrets[vol["secret"]["secretName"]]
                    for key in sec.get("stringData", {}):
                        path = os.path.join(where, key)
                        with open(path, "w") as f:
                            f.write("pods-%s-%s-secret\n" % (tag, key))  # the test's own secret
                        os.chmod(path, vol["secret"].get("defaultMode", 0o644))
                mounts[m["mountPath"]] = where

            def place(s):
                table = list(mounts.items()) + [("/opt/dtrain/apps", a.src + "/apps"), ("/tmp", root + "/tmp")]
                for image_path, here in table:
                    if s == image_path or s.startswith(image_path.rstrip("/") + "/"):
                        return here + s[len(image_path):]
                return s

            argv = [place(expand(x, env)) for x in pod.container.get("command", []) + pod.container.get("args", [])]
            if a.run == "conformance":
                argv = [x for x in argv if not x.endswith(".toml")] + CONFORMANCE
            else:
                short = {"cls": CLS_SHORT, "cls-kill": CLS_KILL, "ctr": CTR_SHORT}[a.run]
                argv += [x.replace("{shared}", os.path.join(work, "shared")) for x in short]
            pod.out = os.path.join(root, "out.txt")
            pod.argv = argv
            pod.elastic = ":" in nnodes_of(argv, env)
            procs.append(subprocess.Popen(["ip", "netns", "exec", pod.ns, "env", "-i"] +
                                          ["%s=%s" % kv for kv in env.items()] + argv,
                                          cwd=root, stdout=open(pod.out, "w"), stderr=subprocess.STDOUT))
        deadline = time.time() + a.timeout
        lost = node0 = None
        if a.run == "cls-kill":
            killed = lose_a_pod(pods, procs, deadline)
            if isinstance(killed, str):
                print("run_pods: cls-kill: " + killed)
            else:
                node0, lost = killed
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1, deadline - time.time())))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append("timeout")
        ok = True
        for pod, code in zip(pods, codes):
            logs = ""
            logdir = os.path.join(work, pod.name, "tmp", "log")
            for f in sorted(os.listdir(logdir)) if os.path.isdir(logdir) else []:
                logs += open(os.path.join(logdir, f), errors="replace").read()
            pod.logs = logs
            print("pod %s (%s): exit %s: %s" % (pod.name, pod.ip, code, " ".join(pod.argv)))
            if pod is lost:
                continue
            if code != 0:
                ok = False
                print(open(pod.out, errors="replace").read()[-3000:] + logs[-3000:])
            elif a.run == "conformance" and not re.search(r"\d+ passed, 0 failed", logs):
                ok = False
                print("pod %s: no worker printed 'N passed, 0 failed'\n%s" % (pod.name, logs[-2000:]))
        if any(pod.elastic for pod in pods):
            ok = elastic_formed(pods) and ok
        if a.run == "cls-kill":
            ok = ok and node0 is not None and elastic_went_on(node0, lost, len(pods) - 1)
        want = {"cls": "eval epoch 1: top1", "cls-kill": "eval epoch 1: top1", "ctr": "ctr: test auc"}.get(a.run)
        if want and ok:
            lines = [line for pod in pods for line in pod.logs.splitlines() if want in line]
            if not lines:
                ok = False
                print("no worker printed '%s'\n%s" % (want, "".join(p.logs[-1500:] for p in pods)))
            else:
                print(lines[-1])
        return 0 if ok else 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
            shutil.rmtree("/etc/netns/" + ns, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
