#include "dtrain/job_secret.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "dtrain/job_token.h"
#include "dtrain/sdk/strings.h"

namespace dtrain {

namespace {

const char* const kHowTo =
    "make one secret and give it to every machine of the job:\n"
    "    head -c 32 /dev/urandom | base64 > ~/.dtrain_token && chmod 600 ~/.dtrain_token\n"
    "  then copy that file to the other machines and add --token_file ~/.dtrain_token (or export\n"
    "  DTRAIN_JOB_TOKEN=<the secret> on each machine); or run the job open to anyone who can reach\n"
    "  the store with --insecure_open_job. A job started without dtrain (torchrun, mpirun or Slurm\n"
    "  variables) takes DTRAIN_TOKEN_FILE=~/.dtrain_token, or DTRAIN_INSECURE_OPEN_JOB=1";

std::string read_token_file(const std::string& path, const std::string& name) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw InvalidUsage(fmt::format("{} {}: {}", name, path, std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) throw InvalidUsage(fmt::format("{} {} is not a regular file", name, path));
  if (st.st_mode & (S_IRWXG | S_IRWXO))
    throw InvalidUsage(
        fmt::format("{} {} is accessible by group or others (mode {:04o}): anyone on this "
                    "machine could join the job; make it private with `chmod 600 {}`, as for an SSH key",
                    name, path, st.st_mode & 07777, path));
  if (st.st_uid != ::geteuid() && st.st_uid != 0)
    throw InvalidUsage(fmt::format("{} {} belongs to user {}, not to this user ({}): use your own file", name, path,
                                   st.st_uid, ::geteuid()));
  std::ifstream in(path);
  if (!in) throw InvalidUsage(fmt::format("{} {}: cannot read it", name, path));
  std::stringstream ss;
  ss << in.rdbuf();
  return sdk::trim(ss.str());
}

void check_strength(const std::string& secret, const std::string& where) {
  if (secret.size() < kMinSecretLength)
    throw InvalidUsage(
        fmt::format("the job secret from {} has {} characters; at least {} are needed so that it "
                    "cannot be guessed; {}",
                    where, secret.size(), kMinSecretLength, kHowTo));
}

}  // namespace

SecretOptions secret_options_from_env() {
  SecretOptions o;
  o.token_file_name = "DTRAIN_TOKEN_FILE";
  if (const char* f = std::getenv("DTRAIN_TOKEN_FILE"); f && *f) o.token_file = f;
  const char* open = std::getenv("DTRAIN_INSECURE_OPEN_JOB");
  o.insecure_open_job = open && std::string(open) == "1";
  return o;
}

JobSecret resolve_job_secret(const SecretOptions& o, const std::string& job_id, bool multi_machine) {
  JobSecret s;
  std::string secret;
  if (!o.token_file.empty()) {
    secret = read_token_file(o.token_file, o.token_file_name);
    s.source = "from the file " + o.token_file;
  } else if (const char* env = std::getenv("DTRAIN_JOB_TOKEN"); env && *env) {
    secret = sdk::trim(env);
    s.source = "from DTRAIN_JOB_TOKEN";
  }
  if (!multi_machine) {
    // Nothing off this machine reaches a loopback store: a fresh token is enough.
    if (secret.empty()) {
      s.token = make_job_token();
      s.source = "random, this machine only";
    } else {
      s.token = secret;
    }
    return s;
  }
  if (!secret.empty()) {
    check_strength(secret, s.source.substr(5));
    s.token = secret + "/" + job_id;
    return s;
  }
  if (o.insecure_open_job) {
    s.token = "dtrain-open-job:" + job_id;
    s.source = "OPEN (no secret): any host that reaches the store can join the job, read and write it";
    s.open = true;
    return s;
  }
  throw InvalidUsage(fmt::format(
      "a job on several machines needs a shared secret: its store listens on the network, and without one any host "
      "that reaches the port could read the job's keys and write false ones; {}",
      kHowTo));
}

}  // namespace dtrain
