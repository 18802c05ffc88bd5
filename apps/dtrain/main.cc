// dtrain: starts a distributed training job, as paddle.distributed.launch and torchrun do.
//
//   dtrain [options] JOB.toml              runs the job file's [job] program
//   dtrain [options] PROGRAM ARGS...       runs any program (as Paddle's launch; `--` before it also works)
//   dtrain plugins [--keys]                lists the installed backends [and their keys]
//   dtrain check [--ips a,b | --master h:p --nnodes N --rank R]   pre-flight checks
#include <unistd.h>

#include <climits>
#include <cstring>
#include <filesystem>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "commands.h"
#include "gpu.h"
#include "layout.h"
#include "dtrain/config.h"
#include "dtrain/error.h"
#include "dtrain/log.h"
#include "dtrain/sdk/strings.h"
#include "elastic.h"
#include "launcher.h"
#include "program.h"

using namespace dtrain;
using namespace dtrain::launch;
namespace fs = std::filesystem;

namespace {

// Paddle's launch takes the program as its first positional: the first
// argument that is neither an option, an option's value, a subcommand nor a
// .toml job file starts the command; everything after it is the program's.
void split_program(CLI::App& app, std::vector<char*>& args, std::vector<std::string>& command) {
  for (size_t i = 1; i < args.size(); ++i) {
    std::string tok = args[i];
    if (tok.size() > 1 && tok[0] == '-') {
      const CLI::Option* opt = app.get_option_no_throw(tok.substr(0, tok.find('=')));
      if (opt && tok.find('=') == std::string::npos && opt->get_items_expected_min() != 0) ++i;
      continue;
    }
    if (tok == "plugins" || tok == "check") return;
    if (tok.size() > 5 && tok.compare(tok.size() - 5, 5, ".toml") == 0) continue;
    command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
    args.resize(i);
    return;
  }
}

// --gpus sets the devices and, unless --nproc_per_node is given, the worker
// count (over the job file's nproc_per_node); --backend nccl without --gpus
// takes every visible GPU, one worker each, as Paddle's launch does.
void resolve_devices(LaunchOptions& lo, bool nproc_on_command_line, const std::string& gpus) {
  if (!lo.devices.empty()) {
    lo.devices_source = "--gpus " + gpus;
    if (!nproc_on_command_line) {
      lo.nproc_per_node = static_cast<int>(lo.devices.size());
      lo.nproc_source = lo.devices_source;
    }
    return;
  }
  if (lo.backend != "nccl" || ps_mode(lo)) return;
  CudaDevices found = probe_cuda_devices();
  if (found.names.empty())
    throw InvalidUsage("--backend nccl trains on GPUs, one worker each, but " + found.problem +
                       "; use --backend gloo or --backend ucx on CPU-only machines");
  const int n = static_cast<int>(found.names.size());
  const int want = nproc_on_command_line ? std::min(lo.nproc_per_node, n) : n;
  for (int i = 0; i < want; ++i) lo.devices.push_back(std::to_string(i));
  lo.devices_source = fmt::format("every visible GPU ({}), --backend nccl", n);
  if (!nproc_on_command_line) {
    lo.nproc_per_node = n;
    lo.nproc_source = lo.devices_source;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> command;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      for (int j = i + 1; j < argc; ++j) command.push_back(argv[j]);
      break;
    }
    args.push_back(argv[i]);
  }

  CLI::App app{
      "dtrain: starts a distributed training job on one or many machines.\n\n"
      "  dtrain [options] JOB.toml              runs the job file's [job] program\n"
      "  dtrain [options] PROGRAM ARGS...       runs any program (or: dtrain [options] -- PROGRAM ARGS...);\n"
      "                                         PROGRAM.py runs as `PYTHON -u PROGRAM.py ARGS` (see --python)\n"
      "  dtrain plugins | dtrain check          installed backends | pre-flight checks\n\n"
      "Every process gets DTRAIN_RANK, DTRAIN_WORLD_SIZE, DTRAIN_LOCAL_RANK, DTRAIN_STORE, DTRAIN_JOB_TOKEN,\n"
      "DTRAIN_RESTART_COUNT ... and Paddle's PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ENDPOINTS,\n"
      "PADDLE_CURRENT_ENDPOINT, TRAINING_ROLE, PADDLE_PSERVERS_IP_PORT_LIST, and every worker torchrun's RANK,\n"
      "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_* ... When one process fails, the job\n"
      "stops on every machine and one root-cause report names it.",
      "dtrain"};
  app.set_version_flag("--version", std::string("dtrain ") + core_version());
  LaunchOptions lo;
  std::string job_file, gpus, ips, servers, workers;
  std::vector<std::string> overrides;
  app.add_option("job", job_file, "job file (TOML) whose [job] program is started");
  auto* nproc =
      app.add_option("--nproc_per_node", lo.nproc_per_node, "worker processes on this machine (collective mode)");
  app.add_option("--gpus,--devices", gpus,
                 "CUDA devices, one worker each (or --nproc_per_node workers taking them in turn), e.g. 0,1; "
                 "over the job file's nproc_per_node; sets DTRAIN_DEVICE and FLAGS_selected_gpus; a device the "
                 "machine lacks is refused. Default with --backend nccl: every visible GPU");
  app.add_option("--ips", ips,
                 "every machine's address, comma separated; run the same command on each (default: this machine only)");
  app.add_option("--master", lo.master,
                 "host:port of the job store, instead of --ips (with --nnodes; without --rank the master's machine is "
                 "node 0 and the others are numbered as they join; default: PADDLE_MASTER)");
  std::string nnodes = "1";
  auto* nnodes_opt = app.add_option("--nnodes", nnodes,
                                    "number of machines with --master, or MIN:MAX for an elastic job (machines may "
                                    "leave and join; see docs/elastic.md) (default: PADDLE_NNODES, PET_NNODES, else 1)")
                         ->capture_default_str();
  app.add_option("--elastic_timeout", lo.elastic_timeout_s,
                 "elastic jobs: seconds to wait for machines to join when fewer than MIN are left")
      ->capture_default_str();
  app.add_option("--rank", lo.node_rank, "this machine's index (optional with --master and --ips)");
  app.add_option("--start_port", lo.start_port,
                 "first port of the job's range on every machine (default: FLAGS_START_PORT): the store on it, then "
                 "an endpoint per process, then 32 ports per process for its transports (Gloo, UCX over TCP); "
                 "without it: the store on 6170 on several machines, any free port on one, and free ports elsewhere");
  app.add_option("--log_dir", lo.log_dir, "folder for workerlog.N, serverlog.N and endpoints.log")
      ->capture_default_str();
  auto* server_num_opt = app.add_option("--server_num", lo.server_num,
                                        "parameter servers on this machine (parameter-server mode; default: "
                                        "PADDLE_SERVER_NUM, as a PaddleJob's master pods have it)");
  auto* worker_num_opt = app.add_option("--worker_num", lo.worker_num,
                                        "workers on this machine (parameter-server mode; default: PADDLE_TRAINER_NUM; "
                                        "0 on a machine of servers only)");
  app.add_option("--servers", servers, "server endpoints ip:port,... over all machines (parameter-server mode)");
  app.add_option("--workers", workers, "worker endpoints ip:port,... over all machines (parameter-server mode)");
  app.add_option("--job_id", lo.job_id, "job id (also keeps other jobs out of this job's store on several machines)");
  app.add_option("--token_file", lo.token_file,
                 "file holding the job's secret (only its owner may read it: chmod 600); needed on several machines "
                 "unless DTRAIN_JOB_TOKEN holds the secret");
  app.add_flag("--insecure_open_job", lo.insecure_open_job,
               "run a job on several machines without a secret: any host that reaches the store can join it");
  ProgramOptions po;
  app.add_option("--python", po.python,
                 "interpreter of a Python program (PROGRAM.py or -m MODULE), run as `PYTHON -u PROGRAM ARGS` "
                 "(default: DTRAIN_PYTHON, else the interpreter dtrain's Python package was built for)");
  app.add_flag("-m,--module", po.module,
               "the program is a Python module, run as `PYTHON -u -m MODULE ARGS` (torchrun's -m)");
  app.add_flag("--no_python", po.no_python, "run the program as it is, even a .py file (torchrun's --no_python)");
  app.add_flag("--local_rank_arg", lo.local_rank_arg,
               "append --local_rank=N to every worker's arguments, for scripts written for the legacy "
               "torch.distributed.launch / paddle.distributed.launch that parse it");
  app.add_option("--backend", lo.backend, "backend plugin, overrides the job file's [job] backend");
  app.add_option("-o", overrides, "override a job-file key: -o train.epochs=2 (repeatable)")
      ->allow_extra_args(false);  // one value per -o: `-o a=1 JOB.toml` keeps JOB.toml positional
  app.add_option("--max_restarts,--max_restart", lo.max_restarts, "restart the whole job up to N times after a failure")
      ->capture_default_str();
  app.add_option("--log_level", lo.log_level, "trace, debug, info, warn, error (DTRAIN_LOG_LEVEL of every process)");
  app.add_option("--grace_period", lo.grace_s, "seconds between SIGTERM and SIGKILL when stopping the job")
      ->capture_default_str();
  app.add_option("--server_stop_timeout", lo.server_stop_s,
                 "parameter-server jobs: seconds the servers get to save and exit after every worker finished")
      ->capture_default_str();
  app.add_option("--join_timeout", lo.join_timeout_s, "seconds to wait for the other machines")->capture_default_str();

  auto* plugins_cmd =
      app.add_subcommand("plugins", "list the installed backend plugins (name, version, ABI, capabilities)");
  std::vector<std::string> plugin_dirs;
  plugins_cmd->add_option("--plugin-path", plugin_dirs, "extra folder to search");
  bool plugin_keys = false;
  plugins_cmd->add_flag("--keys", plugin_keys,
                        "also list each backend's keys: name, type, default, doc (with an int key's bound)");

  auto* check_cmd = app.add_subcommand("check", "pre-flight checks: store reachable, interface, versions, ports");
  CheckOptions co;
  std::string check_ips;
  check_cmd->add_option("--ips", check_ips, "every machine's address, as for the job");
  check_cmd->add_option("--master", co.machines.master, "host:port of the job store");
  check_cmd->add_option("--nnodes", co.machines.nnodes, "number of machines with --master");
  check_cmd->add_option("--rank", co.machines.node_rank, "this machine's index");
  check_cmd->add_option("--start_port", co.machines.start_port, "the job store's port");
  check_cmd->add_option("--token_file", co.secret.token_file, "the job's secret file, as for the job");
  check_cmd->add_flag("--insecure_open_job", co.secret.insecure_open_job, "the job runs without a secret");
  check_cmd->add_option("--backend", co.backend, "check that this backend loads");
  check_cmd->add_option("--job_id", co.job_id, "job id");
  check_cmd->add_option("--timeout", co.timeout_s, "seconds for each network check")->capture_default_str();

  if (command.empty()) split_program(app, args, command);
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    if (!lo.log_level.empty()) set_log_level(lo.log_level);
    if (*plugins_cmd) return list_plugins(plugin_dirs, plugin_keys);
    if (*check_cmd) {
      co.machines.ips = sdk::split(check_ips);
      return run_check(co);
    }
    // A PaddleJob's pods (Kubeflow's training operator) name the master and
    // the machine count only in Paddle's variables, as paddle.distributed.launch reads them.
    if (lo.master.empty() && ips.empty())
      if (const char* m = std::getenv("PADDLE_MASTER"); m && *m) lo.master = m;
    // A PyTorchJob with an elasticPolicy gives torchrun's PET_* forms.
    if (lo.master.empty() && ips.empty())
      if (const char* m = std::getenv("PET_RDZV_ENDPOINT"); m && *m) lo.master = m;
    std::string nnodes_from = "--nnodes";
    if (nnodes_opt->count() == 0)
      for (const char* var : {"PADDLE_NNODES", "PET_NNODES"})
        if (const char* n = std::getenv(var); n && *n) {
          nnodes = n, nnodes_from = var;
          break;
        }
    parse_nnodes(nnodes, nnodes_from, &lo.nnodes_min, &lo.nnodes);
    if (lo.elastic()) {
      if (!ips.empty() || lo.master.empty())
        throw InvalidUsage(nnodes_from + " " + nnodes +
                           " (elastic) needs --master host:port: positions in a fixed --ips list cannot change");
      if (lo.node_rank > 0)
        throw InvalidUsage("--rank with --nnodes MIN:MAX: an elastic job numbers its machines itself");
    }
    if (server_num_opt->count() == 0)
      if (const char* n = std::getenv("PADDLE_SERVER_NUM"); n && *n) lo.server_num = std::atoi(n);
    if (worker_num_opt->count() == 0)
      if (const char* n = std::getenv("PADDLE_TRAINER_NUM"); n && *n) lo.worker_num = std::atoi(n);
    lo.ips = sdk::split(ips);
    lo.devices = sdk::split(gpus);
    lo.servers = sdk::split(servers);
    lo.workers = sdk::split(workers);

    if (!job_file.empty() && !command.empty())
      throw InvalidUsage("give either a job file or `-- PROGRAM ARGS`, not both");
    if (!job_file.empty()) {
      Config cfg = Config::from_file(job_file, overrides);
      // The program validates the whole file against its schema; the launcher
      // reads only [job] (a wrong type there is a ConfigError naming the key).
      std::string program = cfg.get_string("job.program");
      if (program.empty()) {
        ConfigLocation loc = cfg.location_of("job");
        throw ConfigError(
            job_file, loc.line, loc.column, "job.program",
            "the job file has no [job] program: name the program that runs it, e.g. program = \"dtrain-cls\"");
      }
      if (!nproc->count() && cfg.has("job.nproc_per_node")) {
        lo.nproc_per_node = static_cast<int>(cfg.get_int("job.nproc_per_node"));
        lo.nproc_source = "[job] nproc_per_node at " + cfg.location_of("job.nproc_per_node").str();
      }
      if (lo.job_id.empty()) lo.job_id = cfg.get_string("job.job_id");
      if (lo.backend.empty()) lo.backend = cfg.get_string("job.backend");
      command = program_command({program, fs::absolute(job_file).string()}, po, &lo.python);
      for (auto& ov : overrides) command.insert(command.end(), {"-o", ov});
      if (cfg.has("job.args"))
        for (auto& a : cfg.get_string_list("job.args")) command.push_back(a);
    } else if (!command.empty()) {
      if (!overrides.empty())
        throw InvalidUsage("-o overrides keys of a job file; with `-- PROGRAM` pass options to the program");
      command = program_command(command, po, &lo.python);
    } else {
      std::cerr << app.help() << "\n";
      return 2;
    }
    if (nproc->count()) lo.nproc_source = "--nproc_per_node";
    resolve_devices(lo, nproc->count() > 0, gpus);
    if (!lo.devices.empty() && !ps_mode(lo) && lo.nproc_per_node < static_cast<int>(lo.devices.size()))
      throw InvalidUsage(
          fmt::format("--nproc_per_node {} is fewer than the {} devices of {}: every device "
                      "needs a worker",
                      lo.nproc_per_node, lo.devices.size(), lo.devices_source));
    if (lo.elastic() && ps_mode(lo))
      throw InvalidUsage(
          "--nnodes MIN:MAX is for collective jobs; a parameter-server job runs on a fixed set of "
          "machines (docs/elastic.md says why)");
    lo.command = command;
    return run_job(lo);
  } catch (const std::exception& e) {
    std::cerr << "dtrain: " << e.what() << "\n";
    return 2;
  }
}
