#pragma once
// The job store's secret. On one machine the store listens on loopback and the
// launcher makes a random token for its own processes. On several machines the
// store is reachable from the network, so the machines must share a secret
// nobody else can know or guess: from a token file (a file only its owner can
// read, as an SSH key) or DTRAIN_JOB_TOKEN. Without one the job refuses to
// start, unless the user says to run it open. The launcher's --token_file and
// --insecure_open_job, and DTRAIN_TOKEN_FILE and DTRAIN_INSECURE_OPEN_JOB=1 for
// jobs started without it (torchrun, mpirun, Slurm variables), follow this one
// rule.

#include <cstddef>
#include <string>

namespace dtrain {

struct SecretOptions {
  std::string token_file;                        // "" = none
  bool insecure_open_job = false;                // run without a secret, open to anyone
  std::string token_file_name = "--token_file";  // how errors name the file's option
};

// The options of a job started without the launcher: DTRAIN_TOKEN_FILE and
// DTRAIN_INSECURE_OPEN_JOB=1 from the environment.
SecretOptions secret_options_from_env();

// The shortest secret accepted for a job on several machines.
constexpr size_t kMinSecretLength = 16;

struct JobSecret {
  std::string token;   // what the store checks; never printed
  std::string source;  // for the table: "from the file /x", "from DTRAIN_JOB_TOKEN", "OPEN (no secret) ..."
  bool open = false;   // anyone who reaches the store can join
};

// The store token for this job. On several machines it binds the secret to the
// job id, so that another job sharing the secret is still kept out. On one
// machine without a secret it is a fresh random token (only the launcher, which
// hands it to its children, may ask for that). Throws InvalidUsage saying how to
// provide a secret when there is none (several machines, not open), and when the
// file is readable by others, missing or shorter than kMinSecretLength.
JobSecret resolve_job_secret(const SecretOptions& o, const std::string& job_id, bool multi_machine);

}  // namespace dtrain
