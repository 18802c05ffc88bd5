#pragma once

#include <string>

namespace dtrain {

// Generates a random job token (32 hex chars from /dev/urandom). Throws IoError
// when /dev/urandom cannot be read.
std::string make_job_token();

}  // namespace dtrain
