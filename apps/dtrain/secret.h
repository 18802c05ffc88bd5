#pragma once
// The job store's token. On one machine the store listens on loopback and the
// launcher makes a random token for its own processes. On several machines the
// store is reachable from the network, so the machines must share a secret
// nobody else can know or guess: from --token_file (a file only its owner can
// read, as an SSH key) or DTRAIN_JOB_TOKEN. Without one the job refuses to
// start, unless --insecure_open_job says to run it open.

#include <cstddef>
#include <string>

namespace dtrain::launch {

struct SecretOptions {
  std::string token_file;          // --token_file
  bool insecure_open_job = false;  // --insecure_open_job
};

// The shortest secret accepted for a job on several machines.
constexpr size_t kMinSecretLength = 16;

struct JobSecret {
  std::string token;   // what the store checks; never printed
  std::string source;  // for the table: "file /x", "DTRAIN_JOB_TOKEN", "OPEN (no secret) ..."
  bool open = false;   // anyone who reaches the store can join
};

// The store token for this job. On several machines it binds the secret to the
// job id, so that another job sharing the secret is still kept out. Throws
// InvalidUsage saying how to provide a secret when there is none (several
// machines, not open), and when the file is readable by others, missing or
// shorter than kMinSecretLength.
JobSecret resolve_job_secret(const SecretOptions& o, const std::string& job_id, bool multi_machine);

}  // namespace dtrain::launch
