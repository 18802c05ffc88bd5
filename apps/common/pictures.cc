#include "common/pictures.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <zlib.h>

#include "dtrain/error.h"

namespace fs = std::filesystem;

namespace dtrain::apps {

namespace {

void put32(std::string& s, uint32_t v) {
  for (int i = 3; i >= 0; --i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void chunk(std::string& out, const char* type, const std::string& data) {
  put32(out, static_cast<uint32_t>(data.size()));
  std::string body = std::string(type, 4) + data;
  out += body;
  put32(out, static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(body.data()), uInt(body.size()))));
}

uint32_t get32(const std::string& s, size_t off) {
  return (uint32_t(uint8_t(s[off])) << 24) | (uint32_t(uint8_t(s[off + 1])) << 16) |
         (uint32_t(uint8_t(s[off + 2])) << 8) | uint8_t(s[off + 3]);
}

// The stored bytes of an 8-bit, non-interlaced grey or palette PNG; false when
// the file is some other kind of PNG (then OpenCV decodes it).
bool decode_indexed_png(const std::string& path, const std::string& file, std::vector<uint8_t>* out, int* h, int* w) {
  if (file.size() < 33 || file.compare(12, 4, "IHDR") != 0) throw IoError("label file '" + path + "': bad PNG header");
  *w = int(get32(file, 16));
  *h = int(get32(file, 20));
  int depth = uint8_t(file[24]), type = uint8_t(file[25]), interlace = uint8_t(file[28]);
  if (depth != 8 || (type != 0 && type != 3) || interlace != 0) return false;
  std::string idat;
  for (size_t off = 8; off + 12 <= file.size();) {
    uint32_t len = get32(file, off);
    if (off + 12 + len > file.size()) throw IoError("label file '" + path + "' is truncated");
    if (file.compare(off + 4, 4, "IDAT") == 0) idat.append(file, off + 8, len);
    off += 12 + len;
  }
  const size_t stride = size_t(*w) + 1;
  std::vector<uint8_t> raw(stride * size_t(*h));
  uLongf n = uLongf(raw.size());
  if (uncompress(raw.data(), &n, reinterpret_cast<const Bytef*>(idat.data()), uLong(idat.size())) != Z_OK ||
      n != raw.size())
    throw IoError("label file '" + path + "': cannot inflate its image data");
  out->assign(size_t(*w) * size_t(*h), 0);
  for (int y = 0; y < *h; ++y) {
    const uint8_t f = raw[y * stride];
    const uint8_t* in = &raw[y * stride + 1];
    uint8_t* row = out->data() + size_t(y) * *w;
    const uint8_t* up = y > 0 ? row - *w : nullptr;
    for (int x = 0; x < *w; ++x) {
      int a = x > 0 ? row[x - 1] : 0, b = up ? up[x] : 0, c = (up && x > 0) ? up[x - 1] : 0, pred = 0;
      switch (f) {
        case 0: pred = 0; break;
        case 1: pred = a; break;
        case 2: pred = b; break;
        case 3: pred = (a + b) / 2; break;
        case 4: {
          int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
          pred = (pa <= pb && pa <= pc) ? a : (pb <= pc ? b : c);
          break;
        }
        default: throw IoError("label file '" + path + "': bad PNG filter " + std::to_string(f));
      }
      row[x] = static_cast<uint8_t>(in[x] + pred);
    }
  }
  return true;
}

}  // namespace

std::vector<Rgb> palette() {
  std::vector<Rgb> p(256, Rgb{255, 255, 255});
  for (int id = 0; id < 255; ++id) {
    int lab = id, r = 0, g = 0, b = 0;
    for (int j = 0; lab; ++j, lab >>= 3) {
      r |= ((lab >> 0) & 1) << (7 - j);
      g |= ((lab >> 1) & 1) << (7 - j);
      b |= ((lab >> 2) & 1) << (7 - j);
    }
    p[id] = Rgb{uint8_t(r), uint8_t(g), uint8_t(b)};
  }
  return p;
}

void write_label_png(const std::string& path, int h, int w, const std::vector<uint8_t>& labels,
                     const std::vector<Rgb>& colours) {
  if (labels.size() != size_t(h) * size_t(w)) throw InvalidUsage("write_label_png: labels do not match the size");
  std::string out("\x89PNG\r\n\x1a\n", 8), ihdr, plte;
  put32(ihdr, uint32_t(w));
  put32(ihdr, uint32_t(h));
  ihdr += std::string("\x08\x03\x00\x00\x00", 5);  // 8-bit palette, no interlace
  for (size_t i = 0; i < 256; ++i)
    for (int c = 0; c < 3; ++c) plte.push_back(static_cast<char>(i < colours.size() ? colours[i][c] : 0));
  std::vector<uint8_t> raw;
  raw.reserve((size_t(w) + 1) * h);
  for (int y = 0; y < h; ++y) {
    raw.push_back(0);
    raw.insert(raw.end(), labels.begin() + size_t(y) * w, labels.begin() + size_t(y + 1) * w);
  }
  uLongf n = compressBound(uLong(raw.size()));
  std::string z(n, '\0');
  if (compress2(reinterpret_cast<Bytef*>(z.data()), &n, raw.data(), uLong(raw.size()), 9) != Z_OK)
    throw IoError("cannot compress '" + path + "'");
  z.resize(n);
  chunk(out, "IHDR", ihdr);
  chunk(out, "PLTE", plte);
  chunk(out, "IDAT", z);
  chunk(out, "IEND", "");
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
  std::ofstream f(path, std::ios::binary);
  f.write(out.data(), std::streamsize(out.size()));
  if (!f) throw IoError("cannot write '" + path + "'");
}

std::vector<uint8_t> read_label_image(const std::string& path, int* h, int* w) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw IoError("label file '" + path + "' does not exist or cannot be read");
  std::string file((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<uint8_t> out;
  if (file.compare(0, 8, std::string("\x89PNG\r\n\x1a\n", 8)) == 0 && decode_indexed_png(path, file, &out, h, w))
    return out;
  cv::Mat m = cv::imread(path, cv::IMREAD_UNCHANGED);
  if (m.empty()) throw IoError("cannot decode label file '" + path + "'");
  if (m.channels() != 1 || m.depth() != CV_8U)
    throw IoError("label file '" + path + "' has " + std::to_string(m.channels()) +
                  " channels; labels must be one 8-bit channel (grey or palette PNG)");
  *h = m.rows;
  *w = m.cols;
  out.resize(size_t(m.rows) * m.cols);
  for (int y = 0; y < m.rows; ++y) std::memcpy(&out[size_t(y) * m.cols], m.ptr<uint8_t>(y), size_t(m.cols));
  return out;
}

void write_image_png(const std::string& path, const Image& im) {
  cv::Mat m(im.height, im.width, im.channels == 3 ? CV_8UC3 : CV_8UC1);
  for (int y = 0; y < im.height; ++y)
    for (int x = 0; x < im.width; ++x)
      for (int c = 0; c < im.channels; ++c)  // Image is RGB, OpenCV writes BGR
        m.ptr<uint8_t>(y)[x * im.channels + (im.channels == 3 ? 2 - c : c)] =
            im.pixels[(size_t(c) * im.height + y) * im.width + x];
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
  if (!cv::imwrite(path, m)) throw IoError("cannot write '" + path + "'");
}

Image side_by_side(const Image& im, const std::vector<uint8_t>& truth, const std::vector<uint8_t>& pred,
                   const std::vector<Rgb>& colours) {
  const int h = im.height, w = im.width, gap = 2;
  Image out{3, h, 3 * w + 2 * gap, {}, {}, {}};
  out.pixels.assign(size_t(3) * h * out.width, 255);
  auto set = [&](int x, int y, int c, uint8_t v) { out.pixels[(size_t(c) * h + y) * out.width + x] = v; };
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) set(x, y, c, im.pixels[(size_t(im.channels == 3 ? c : 0) * h + y) * w + x]);
      const Rgb& t = colours[truth[size_t(y) * w + x]];
      const Rgb& p = colours[pred[size_t(y) * w + x]];
      for (int c = 0; c < 3; ++c) {
        set(w + gap + x, y, c, t[c]);
        set(2 * (w + gap) + x, y, c, p[c]);
      }
    }
  return out;
}

}  // namespace dtrain::apps
