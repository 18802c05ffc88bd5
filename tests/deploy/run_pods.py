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

  run_pods.py MANIFEST --src SRC --bin BIN --run conformance|cls [--timeout S]

--run conformance replaces the job file with dtrain-conformance (every pod's
workers must print "N passed, 0 failed"); --run cls and --run ctr keep the job
file and shorten it with -o overrides (a worker must print its evaluation). Exit 0
when every pod exits 0 and the check holds; 77 without root.
"""
import argparse
import os
import random
import re
import shutil
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


def paddlejob_pods(job):
    """training-operator pkg/controller.v1/paddlepaddle/envvar.go: collective (Worker replicas only), or
    parameter-server mode (Master replicas run servers, Workers trainers)."""
    name = job["metadata"]["name"]
    specs = job["spec"]["paddleReplicaSpecs"]
    total = sum(s["replicas"] for s in specs.values())
    ps = "Master" in specs
    rendezvous = "Master" if ps else "Worker"
    port = port_named(specs[rendezvous]["template"]["spec"]["containers"][0], "master", 36543)
    pods = []
    for rtype in ("Master", "Worker"):
        if rtype not in specs:
            continue
        for i in range(specs[rtype]["replicas"]):
            env = {"PADDLE_JOB_ID": name, "PADDLE_NNODES": str(total), "PYTHONUNBUFFERED": "0"}
            # The rendezvous pod 0 gets its own pod IP (POD_IP_DUMMY), the others its service name.
            own = rtype == rendezvous and i == 0
            env["PADDLE_MASTER"] = ("$(POD_IP_DUMMY):%d" % port if own
                                    else "%s-%s-0:%d" % (name, rendezvous.lower(), port))
            if ps:
                env["PADDLE_SERVER_NUM" if rtype == "Master" else "PADDLE_TRAINER_NUM"] = "1"
            pods.append(Pod("%s-%s-%d" % (name, rtype.lower(), i), specs[rtype]["template"]["spec"], env))
    return pods


def pytorchjob_pods(job):
    """training-operator pkg/controller.v1/pytorch/envvar.go and master.go."""
    name = job["metadata"]["name"]
    specs = job["spec"]["pytorchReplicaSpecs"]
    total = sum(s["replicas"] for s in specs.values())
    master = specs["Master"]
    port = port_named(master["template"]["spec"]["containers"][0], "pytorchjob-port", 23456)
    pods = []
    for rtype, spec in (("master", master), ("worker", specs.get("Worker"))):
        if not spec:
            continue
        for i in range(spec["replicas"]):
            env = {"MASTER_ADDR": "%s-master-0" % name, "MASTER_PORT": str(port), "WORLD_SIZE": str(total),
                   "RANK": str(i + (1 if rtype == "worker" else 0)), "PYTHONUNBUFFERED": "0"}
            pods.append(Pod("%s-%s-%d" % (name, rtype, i), spec["template"]["spec"], env))
    return pods


def indexed_job_pods(job):
    """Kubernetes Indexed Job: JOB_COMPLETION_INDEX, hostname NAME-i, DNS NAME-i.SUBDOMAIN."""
    name = job["metadata"]["name"]
    if job["spec"].get("completionMode") != "Indexed":
        raise SystemExit("run_pods: the Job is not Indexed")
    spec = job["spec"]["template"]["spec"]
    sub = spec.get("subdomain")
    return [Pod("%s-%d" % (name, i), spec, {"JOB_COMPLETION_INDEX": str(i)},
                dns=["%s-%d.%s" % (name, i, sub)] if sub else [])
            for i in range(job["spec"]["completions"])]


def expand(text, env):
    # $(VAR) from the container's environment; $$ is a literal $; unknown stay as written.
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("manifest")
    ap.add_argument("--src", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--run", choices=["conformance", "cls", "ctr"], required=True)
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
    pods = kinds[jobs[0]["kind"]](jobs[0])

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
            root = os.path.join(work, pod.name)
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
                argv += [x.replace("{shared}", os.path.join(work, "shared")) for x in
                         (CLS_SHORT if a.run == "cls" else CTR_SHORT)]
            pod.out = os.path.join(root, "out.txt")
            pod.argv = argv
            procs.append(subprocess.Popen(["ip", "netns", "exec", pod.ns, "env", "-i"] +
                                          ["%s=%s" % kv for kv in env.items()] + argv,
                                          cwd=root, stdout=open(pod.out, "w"), stderr=subprocess.STDOUT))
        deadline = time.time() + a.timeout
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
            if code != 0:
                ok = False
                print(open(pod.out, errors="replace").read()[-3000:] + logs[-3000:])
            elif a.run == "conformance" and not re.search(r"\d+ passed, 0 failed", logs):
                ok = False
                print("pod %s: no worker printed 'N passed, 0 failed'\n%s" % (pod.name, logs[-2000:]))
        want = {"cls": "eval epoch 1: top1", "ctr": "ctr: test auc"}.get(a.run)
        if want and ok:
            line = [l for pod in pods for l in pod.logs.splitlines() if want in l]
            if not line:
                ok = False
                print("no worker printed '%s'\n%s" % (want, "".join(p.logs[-1500:] for p in pods)))
            else:
                print(line[-1])
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
