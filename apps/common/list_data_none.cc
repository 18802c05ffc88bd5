// The apps built without OpenCV (DTRAIN_APPS_OPENCV=OFF, e.g. the offline
// GPU bundle's build_apps.sh): the list data sets, which decode image files,
// are refused with the reason and the fix.
#include "common/data.h"
#include "dtrain/error.h"

namespace dtrain::apps {

std::string list_datasets_unavailable() {
  return "data.dataset = \"list\" decodes image files with OpenCV, and these apps were built without OpenCV "
         "(DTRAIN_APPS_OPENCV=OFF); use the built-in data sets (data.dataset = \"fashion-mnist\") or rebuild the "
         "apps with OpenCV (Debian: libopencv-imgcodecs-dev libopencv-imgproc-dev; cmake -DDTRAIN_APPS_OPENCV=ON)";
}

std::shared_ptr<Dataset> load_list_dataset(const std::string& list_file, const std::string&, int, int, int, size_t) {
  throw InvalidUsage("list file '" + list_file + "': " + list_datasets_unavailable());
}

}  // namespace dtrain::apps
