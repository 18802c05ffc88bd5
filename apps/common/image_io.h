#pragma once
// Image files of the list datasets (PaddleClas, PaddleSeg, PaddleOCR), decoded
// with OpenCV; for the apps' .cc files only (keeps OpenCV out of data.h).

#include <string>
#include <vector>

#include <opencv2/core.hpp>

namespace dtrain::apps {

// Decodes `path` as grey (channels 1) or colour (3, OpenCV's BGR); throws
// IoError naming the file and `where` (" (list.txt:12)") when it cannot.
cv::Mat read_image(const std::string& path, int channels, const std::string& where);

// An 8-bit HWC image (BGR when 3 channels) as Image's CHW pixels (RGB).
std::vector<uint8_t> chw_pixels(const cv::Mat& m, int channels);

}  // namespace dtrain::apps
