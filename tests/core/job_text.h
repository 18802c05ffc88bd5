#pragma once
// A job file's text for a test: parsed as "job.toml" and validated against
// the keys `add` declares, as the launcher and the apps read a job file.
#include <string>

#include "dtrain/config.h"

namespace dtrain::test {

inline Config job_text(const std::string& text, void (*add)(ConfigSchema&)) {
  Config c = Config::from_string(text, "job.toml");
  ConfigSchema s;
  add(s);
  c.validate(s);
  return c;
}

}  // namespace dtrain::test
