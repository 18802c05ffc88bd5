// dtrain-tfevents FILE|DIR: prints every scalar of a TensorBoard event file
// (the newest events.out.tfevents.* of DIR) as "step tag value", after
// checking every record's CRCs and parsing it with the generated classes.
// Exit 1 with the reader's message on a corrupt file. For the shell tests.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include "common/tensorboard.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: dtrain-tfevents FILE|DIR\n");
    return 2;
  }
  namespace fs = std::filesystem;
  try {
    fs::path p = argv[1];
    if (fs::is_directory(p)) {
      fs::path newest;
      for (const auto& e : fs::directory_iterator(p))
        if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0 &&
            (newest.empty() || fs::last_write_time(e.path()) > fs::last_write_time(newest)))
          newest = e.path();
      if (newest.empty()) {
        std::fprintf(stderr, "dtrain-tfevents: no events.out.tfevents.* file in '%s'\n", argv[1]);
        return 1;
      }
      p = newest;
    }
    for (const auto& s : dtrain::apps::read_scalars(p.string()))
      std::printf("%lld %s %.9g\n", static_cast<long long>(s.step), s.tag.c_str(), s.value);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain-tfevents: %s\n", e.what());
    return 1;
  }
}
