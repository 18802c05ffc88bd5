#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/data.h"

namespace dtrain::apps {

// Pictures of segmentation results: the colour palette, label PNGs and the
// image | ground truth | prediction strips written during evaluation.
// Everything here is plain CPU code; callers own the buffers they pass.

using Rgb = std::array<uint8_t, 3>;

// PaddleSeg's (and PASCAL VOC's) colour map: class 0 black, then colours from
// the bits of the class id; 256 entries, index 255 (ignore) white.
std::vector<Rgb> palette();

// Writes labels (height x width, row-major) as an 8-bit palette PNG: the
// pixel values are the class ids (a label file PaddleSeg reads back) and the
// palette shows them in colour. IoError naming the path on failure.
void write_label_png(const std::string& path, int height, int width, const std::vector<uint8_t>& labels,
                     const std::vector<Rgb>& colours);

// Reads a label image: an 8-bit grey or palette PNG gives its stored values
// (the class ids, not the palette's colours); any other single-channel image
// OpenCV can decode gives its grey values. IoError naming the path when it is
// missing, undecodable or has colour channels.
std::vector<uint8_t> read_label_image(const std::string& path, int* height, int* width);

// Writes an RGB (or grey) Image as a PNG. IoError naming the path on failure.
void write_image_png(const std::string& path, const Image& image);

// One strip: the image, its ground truth and the prediction side by side,
// separated by 2 white columns; labels coloured with `colours`.
Image side_by_side(const Image& image, const std::vector<uint8_t>& truth, const std::vector<uint8_t>& prediction,
                   const std::vector<Rgb>& colours);

}  // namespace dtrain::apps
