#pragma once
// Where the job runs: which machine this is, where the store is, which
// processes this machine starts. One layout for the launcher and `dtrain check`,
// so that the check tests the addresses the job will use.

#include <string>
#include <vector>

namespace dtrain::launch {

struct LaunchOptions;

// How the user named the machines (the options of `dtrain` and `dtrain check`).
struct MachineOptions {
  std::vector<std::string> ips;  // --ips: every machine, the first serves the store
  std::string master;            // --master host:port (with nnodes, node_rank)
  int nnodes = 1;
  int node_rank = -1;  // --rank; -1: found from --ips
  int start_port = 0;  // --start_port; 0: FLAGS_START_PORT, else the default
};

// Port of the store on several machines when neither --start_port nor
// FLAGS_START_PORT names one (one machine takes any free port).
constexpr int kDefaultStorePort = 6170;

// A machine joined by --master without --rank, before the store gives it its index.
constexpr int kNodeUnassigned = -2;

struct MachineLayout {
  int nnodes = 1;
  int node = 0;            // this machine's index (kNodeUnassigned until the store gives one)
  std::string my_ip;       // this machine's address in the job: its endpoints, DTRAIN_HOST_IP
  std::string store_host;  // where every machine connects to the store
  int store_port = 0;      // 0: any free port (one machine only)
  // Node 0 serves the store on this address only (never the wildcard): the
  // address this machine has in --ips, the one --master names, or loopback.
  std::string bind_host;
  bool multi_machine() const { return nnodes > 1; }
};

// Lays out the machines from the options and this machine's interfaces.
// Throws InvalidUsage naming the option that is wrong (an --ips list without
// this machine, a --rank out of range, --nnodes > 1 without --ips/--master).
MachineLayout layout_machines(const MachineOptions& o);

enum class SlotRole { Worker, Server };

// One process this machine starts.
struct Slot {
  SlotRole role = SlotRole::Worker;
  int index = 0;  // global rank (workers) or server index; fixed after the node exchange
  int local = 0;  // index among this machine's processes of its role
  std::string endpoint;
  std::string device;
  // With --start_port: this process's own ports ("lo-hi", DTRAIN_PORT_RANGE)
  // for its transports' listeners (Gloo's pairs, UCX over TCP).
  std::string port_range;
  std::string role_name() const { return role == SlotRole::Worker ? "worker" : "server"; }
  std::string log_name() const {
    return (role == SlotRole::Worker ? "workerlog." : "serverlog.") + std::to_string(index);
  }
  std::string name() const {
    return role == SlotRole::Worker ? "worker rank " + std::to_string(index) : "server " + std::to_string(index);
  }
};

// With --start_port P (or FLAGS_START_PORT) every port a machine's job opens
// lies in one range from P: P the store (served by node 0), then one endpoint
// per process (workers, then servers; a busy port is skipped), then a block
// of kPortsPerProcess ports per process for its transports' own listeners.
constexpr int kPortsPerProcess = 32;

// True for parameter-server jobs (--server_num, --worker_num, --servers, --workers).
bool ps_mode(const LaunchOptions& o);

// This machine's processes. With explicit --servers/--workers lists their
// indices are final and *listed is set; otherwise indices are local until the
// machines have exchanged their process counts.
std::vector<Slot> layout_processes(const LaunchOptions& o, const MachineLayout& m, bool* listed);

}  // namespace dtrain::launch
