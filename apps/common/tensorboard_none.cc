// The apps built without protobuf (DTRAIN_APPS_TENSORBOARD=OFF, e.g. the
// offline GPU bundle's build_apps.sh): no TensorBoard event files.
#include "common/tensorboard.h"
#include "dtrain/error.h"

namespace dtrain::apps {

bool event_files_supported(std::string* why) {
  if (why)
    *why =
        "TensorBoard event files are written through protobuf, and these apps were built without it "
        "(DTRAIN_APPS_TENSORBOARD=OFF); set log.tensorboard = \"\" or rebuild the apps with protobuf (Debian: "
        "libprotobuf-dev protobuf-compiler; cmake -DDTRAIN_APPS_TENSORBOARD=ON)";
  return false;
}

EventWriter::EventWriter(const std::string&) {
  std::string why;
  event_files_supported(&why);
  throw InvalidUsage(why);
}
EventWriter::~EventWriter() = default;
void EventWriter::add_scalar(const std::string&, float, int64_t) {}
void EventWriter::flush() {}
void EventWriter::write_record(const std::string&) {}

}  // namespace dtrain::apps
