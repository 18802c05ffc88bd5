#include "ocr/render.h"

#include <ft2build.h>
#include FT_FREETYPE_H
#include FT_OUTLINE_H

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <unordered_map>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "common/image_io.h"
#include "dtrain/error.h"
#include "dtrain/sdk/random.h"

namespace dtrain::apps::ocr {

namespace {

using sdk::splitmix64;  // dtrain/sdk/random.h

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// A small deterministic generator (the standard distributions differ between libraries).
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t s) : state(splitmix64(s)) {}
  uint64_t next() { return state = splitmix64(state); }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }
  double uniform(double a, double b) { return a + (b - a) * uniform(); }
  int integer(int a, int b) { return a + int(next() % uint64_t(b - a + 1)); }  // [a, b]
  bool chance(double p) { return uniform() < p; }
  double normal() {
    double u1 = std::max(uniform(), 1e-12), u2 = uniform();
    return std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
  }
};

// The FreeType library and the faces one thread has opened.
class FaceCache {
 public:
  FaceCache() {
    if (FT_Init_FreeType(&lib_) != 0) throw InvalidUsage("cannot initialise FreeType");
  }
  ~FaceCache() {
    for (auto& kv : faces_) FT_Done_Face(kv.second);
    FT_Done_FreeType(lib_);
  }
  FaceCache(const FaceCache&) = delete;
  FaceCache& operator=(const FaceCache&) = delete;
  FT_Face get(const std::string& path) {
    auto it = faces_.find(path);
    if (it != faces_.end()) return it->second;
    FT_Face face = nullptr;
    if (FT_New_Face(lib_, path.c_str(), 0, &face) != 0)
      throw InvalidUsage("cannot load font '" + path + "' (missing, or not a font FreeType reads)");
    faces_[path] = face;
    return face;
  }
  static FaceCache& mine() {
    thread_local FaceCache cache;
    return cache;
  }

 private:
  FT_Library lib_ = nullptr;
  std::unordered_map<std::string, FT_Face> faces_;
};

uint32_t code_point(const std::string& ch) {
  const auto* b = reinterpret_cast<const unsigned char*>(ch.data());
  if (ch.size() == 1) return b[0];
  if (ch.size() == 2) return (uint32_t(b[0] & 0x1f) << 6) | (b[1] & 0x3f);
  if (ch.size() == 3) return (uint32_t(b[0] & 0x0f) << 12) | (uint32_t(b[1] & 0x3f) << 6) | (b[2] & 0x3f);
  return (uint32_t(b[0] & 0x07) << 18) | (uint32_t(b[1] & 0x3f) << 12) | (uint32_t(b[2] & 0x3f) << 6) | (b[3] & 0x3f);
}

}  // namespace

std::vector<std::string> missing_glyphs(const std::string& font, const std::vector<std::string>& chars) {
  FT_Face face = FaceCache::mine().get(font);
  std::vector<std::string> out;
  for (const auto& ch : chars)
    if (ch != " " && FT_Get_Char_Index(face, code_point(ch)) == 0) out.push_back(ch);
  return out;
}

cv::Mat render_text(const std::string& text, const std::string& font, uint64_t seed, const RenderOptions& o) {
  Rng rng(seed);
  const bool aug = o.augment;
  const int px =
      aug ? rng.integer(o.min_font_px, std::max(o.min_font_px, o.max_font_px)) : (o.min_font_px + o.max_font_px) / 2;
  FT_Face face = FaceCache::mine().get(font);
  if (FT_Set_Pixel_Sizes(face, 0, FT_UInt(px)) != 0) throw InvalidUsage("font '" + font + "': cannot set its size");
  const int asc = int(face->size->metrics.ascender >> 6), desc = int(-(face->size->metrics.descender >> 6));
  const double spacing = aug ? rng.uniform(-0.02, o.spacing) * px : 0.0;
  // Draws only when enabled, so the other draws of a seed stay those of a job without them.
  const double stroke = aug && o.stroke > 0 ? rng.uniform(-o.stroke, o.stroke) * px : 0.0;
  const double stretch = aug && o.stretch > 0 ? std::exp(rng.uniform(-1.0, 1.0) * std::log1p(o.stretch)) : 1.0;
  auto chars = utf8_chars(text);
  // The ink, on a canvas wide enough for any advance; baseline at `pad + asc`.
  const int pad = px, width = int(chars.size()) * (2 * px + 4) + 2 * pad, height = asc + desc + 2 * pad;
  cv::Mat ink = cv::Mat::zeros(height, width, CV_8UC1);
  double pen = pad;
  FT_UInt prev = 0;
  int ink_x0 = width, ink_x1 = 0;
  for (const auto& ch : chars) {
    FT_UInt gi = FT_Get_Char_Index(face, code_point(ch));
    if (gi == 0 && ch != " ") throw InvalidUsage("font '" + font + "' has no glyph for '" + ch + "'");
    if (prev && gi && FT_HAS_KERNING(face)) {
      FT_Vector k;
      if (FT_Get_Kerning(face, prev, gi, FT_KERNING_DEFAULT, &k) == 0) pen += double(k.x) / 64.0;
    }
    bool ok = FT_Load_Glyph(face, gi, stroke != 0 ? FT_LOAD_NO_BITMAP : FT_LOAD_DEFAULT) == 0;
    if (ok && stroke != 0 && face->glyph->format == FT_GLYPH_FORMAT_OUTLINE)
      ok = FT_Outline_Embolden(&face->glyph->outline, FT_Pos(std::lround(stroke * 64))) == 0;
    if (!ok || FT_Render_Glyph(face->glyph, FT_RENDER_MODE_NORMAL) != 0)
      throw InvalidUsage("font '" + font + "': cannot render '" + ch + "'");
    const FT_Bitmap& bm = face->glyph->bitmap;
    int x0 = int(std::lround(pen)) + face->glyph->bitmap_left, y0 = pad + asc - face->glyph->bitmap_top;
    for (int y = 0; y < int(bm.rows); ++y) {
      int yy = y0 + y;
      if (yy < 0 || yy >= height) continue;
      const unsigned char* src = bm.buffer + y * bm.pitch;
      uint8_t* dst = ink.ptr<uint8_t>(yy);
      for (int x = 0; x < int(bm.width); ++x) {
        int xx = x0 + x;
        if (xx >= 0 && xx < width && src[x]) dst[xx] = std::max<uint8_t>(dst[xx], src[x]);
      }
    }
    if (bm.width > 0) {
      ink_x0 = std::min(ink_x0, x0);
      ink_x1 = std::max(ink_x1, x0 + int(bm.width));
    }
    pen += double(face->glyph->advance.x) / 64.0 + spacing;
    prev = gi;
  }
  if (ink_x1 <= ink_x0) {  // only spaces
    ink_x0 = pad;
    ink_x1 = std::max(pad + 1, int(pen));
  }
  // The crop: the ink's columns and the font's line box (ascender to
  // descender), so lower and upper case keep their heights; margins tight or loose.
  auto margin = [&] {
    if (!aug) return 0.1 * px;
    return rng.chance(o.tight) ? rng.uniform(-0.03, 0.05) * px : rng.uniform(0.0, o.margin) * px;
  };
  double left = ink_x0 - margin(), right = ink_x1 + margin();
  double top = pad - margin(), bottom = pad + asc + desc + margin();
  const int out_w = std::max(4, int(std::lround((right - left) * stretch)));
  const int out_h = std::max(4, int(std::lround(bottom - top)));
  // Output pixel -> canvas pixel: about the crop's centre, stretch, shear (slant) then rotation.
  double shear = aug ? rng.uniform(-o.slant, o.slant) : 0.0;
  double angle = aug ? rng.uniform(-o.rotate, o.rotate) * M_PI / 180.0 : 0.0;
  double cx = (left + right) / 2, cy = (top + bottom) / 2, c = std::cos(angle), s = std::sin(angle);
  // canvas = centre + R * S * D * (out - out_centre), S = [[1, shear], [0, 1]], D = diag(1 / stretch, 1)
  double a00 = c / stretch, a01 = c * shear - s, a10 = s / stretch, a11 = s * shear + c;
  double ox = out_w / 2.0, oy = out_h / 2.0;
  cv::Mat inverse = (cv::Mat_<double>(2, 3) << a00, a01, cx - a00 * ox - a01 * oy, a10, a11, cy - a10 * ox - a11 * oy);
  cv::Mat alpha;
  cv::warpAffine(ink, alpha, inverse, cv::Size(out_w, out_h), cv::INTER_LINEAR | cv::WARP_INVERSE_MAP,
                 cv::BORDER_CONSTANT, cv::Scalar(0));
  // Colours: text and background at least min_contrast apart, either darker.
  int bg = 255, fg = 0;
  if (aug) {
    do {
      bg = rng.integer(0, 255);
      fg = rng.integer(0, 255);
    } while (std::abs(bg - fg) < o.min_contrast);
  }
  cv::Mat back(out_h, out_w, CV_32FC1, cv::Scalar(bg));
  if (aug && rng.chance(o.texture)) {
    int gw = rng.integer(2, 6), gh = rng.integer(2, 4);
    cv::Mat grid(gh, gw, CV_32FC1), smooth;
    double amp = std::min(0.6 * std::abs(bg - fg), 60.0);
    for (int y = 0; y < gh; ++y)
      for (int x = 0; x < gw; ++x) grid.at<float>(y, x) = float(rng.uniform(-amp, amp) * 0.5);
    cv::resize(grid, smooth, back.size(), 0, 0, cv::INTER_CUBIC);
    back += smooth;
  }
  cv::Mat a, img;
  alpha.convertTo(a, CV_32FC1, 1.0 / 255.0);
  img = back.mul(1.0 - a) + a * double(fg);
  if (aug && rng.chance(o.blur)) {
    double sigma = rng.uniform(0.3, 1.2) * px / 32.0;
    cv::GaussianBlur(img, img, cv::Size(0, 0), sigma);
  }
  if (aug && o.noise > 0) {
    double sd = rng.uniform(0, o.noise);
    for (int y = 0; y < img.rows; ++y) {
      float* row = img.ptr<float>(y);
      for (int x = 0; x < img.cols; ++x) row[x] += float(sd * rng.normal());
    }
  }
  cv::Mat out;
  img.convertTo(out, CV_8UC1);  // saturating
  return out;
}

Image model_input(const cv::Mat& m, int channels, int height, int width) {
  if (channels != 1 && channels != 3)
    throw InvalidUsage("image channels must be 1 or 3, got " + std::to_string(channels));
  cv::Mat src = m;
  if (channels == 1 && m.channels() == 3) cv::cvtColor(m, src, cv::COLOR_BGR2GRAY);
  if (channels == 3 && m.channels() == 1) cv::cvtColor(m, src, cv::COLOR_GRAY2BGR);
  double ratio = double(src.cols) / double(std::max(1, src.rows));
  int w = std::min(width, std::max(1, int(std::ceil(height * ratio))));
  cv::Mat resized;
  cv::resize(src, resized, cv::Size(w, height), 0, 0, cv::INTER_LINEAR);
  cv::Mat padded(height, width, resized.type(), cv::Scalar::all(128));
  resized.copyTo(padded(cv::Rect(0, 0, w, height)));
  return Image{channels, height, width, chw_pixels(padded, channels), {}, {}};
}

WordSplit split_words(const std::string& words_file, const CharDict& dict, size_t min_length, size_t max_length,
                      double test_percent) {
  std::ifstream in(words_file);
  if (!in) throw IoError("cannot open word list '" + words_file + "': " + std::strerror(errno));
  WordSplit out;
  std::set<std::string> seen;
  std::string w;
  std::vector<int64_t> ids;
  const uint64_t cut = uint64_t(test_percent / 100.0 * 18446744073709551615.0);
  while (std::getline(in, w)) {
    if (!w.empty() && w.back() == '\r') w.pop_back();
    if (w.empty() || !seen.insert(w).second) continue;
    bool ok = false;
    try {
      ok = dict.encode(w, &ids) && ids.size() >= min_length && ids.size() <= max_length;
    } catch (const InvalidUsage&) {
      ok = false;  // not UTF-8
    }
    if (!ok) {
      ++out.dropped;
      continue;
    }
    (splitmix64(fnv1a(w)) < cut ? out.test : out.train).push_back(w);
  }
  if (out.train.empty() || out.test.empty())
    throw InvalidUsage("word list '" + words_file + "': no " + std::string(out.train.empty() ? "training" : "test") +
                       " words left after filtering by the dictionary and length");
  return out;
}

RenderedDataset::RenderedDataset(RenderedSetOptions o, const CharDict& dict) : o_(std::move(o)) {
  for (const auto& w : o_.words) {
    std::vector<int64_t> ids;
    std::string bad;
    if (!dict.encode(w, &ids, &bad)) throw InvalidUsage("word '" + w + "' has '" + bad + "', not in the dictionary");
    ids_.push_back(std::move(ids));
  }
  if (ids_.empty()) throw InvalidUsage("a rendered data set needs words");
  if (o_.fonts.empty()) throw InvalidUsage("a rendered data set needs fonts");
  classes_ = int(dict.num_classes());
}

RenderedDataset::Pick RenderedDataset::pick(size_t i, bool train, uint64_t seed, int64_t epoch) const {
  if (!train)
    return {i % ids_.size(), (i + i / ids_.size()) % o_.fonts.size(), splitmix64(o_.seed ^ splitmix64(0xE7A1ULL + i))};
  uint64_t r =
      splitmix64(o_.seed ^ splitmix64(seed ^ splitmix64(uint64_t(epoch) * 0x10001ULL + i * 0x9E3779B1ULL + 11)));
  return {size_t(r % ids_.size()), size_t((r >> 32) % o_.fonts.size()), splitmix64(r)};
}

RenderedDataset::Raw RenderedDataset::raw(size_t i, bool train, uint64_t seed, int64_t epoch) const {
  Pick p = pick(i, train, seed, epoch);
  return {render_text(o_.words[p.word], o_.fonts[p.font], p.seed, o_.render), o_.words[p.word], o_.fonts[p.font]};
}

Image RenderedDataset::get(size_t i, int64_t* label) const {
  Pick p = pick(i, false, 0, 0);
  Image im =
      model_input(render_text(o_.words[p.word], o_.fonts[p.font], p.seed, o_.render), o_.channels, o_.height, o_.width);
  im.text = ids_[p.word];
  *label = int64_t(p.word);
  return im;
}

Image RenderedDataset::get_train(size_t i, uint64_t seed, int64_t epoch, int64_t* label) const {
  Pick p = pick(i, true, seed, epoch);
  Image im =
      model_input(render_text(o_.words[p.word], o_.fonts[p.font], p.seed, o_.render), o_.channels, o_.height, o_.width);
  im.text = ids_[p.word];
  *label = int64_t(p.word);
  return im;
}

namespace {

class RecListDataset : public Dataset {
 public:
  RecListDataset(ListFile list, std::string list_file, int classes, int channels, int height, int width)
      : list_(std::move(list)), file_(std::move(list_file)), classes_(classes), c_(channels), h_(height), w_(width) {}
  size_t size() const override { return list_.entries.size(); }
  int channels() const override { return c_; }
  int num_classes() const override { return classes_; }
  Image get(size_t i, int64_t* label) const override {
    const ListEntry& e = list_.entries[i];
    cv::Mat m = read_image(e.path, c_, " (" + file_ + ":" + std::to_string(e.line) + ")");
    Image im = model_input(m, c_, h_, w_);
    im.text = e.ids;
    *label = int64_t(i);
    return im;
  }

 private:
  ListFile list_;
  std::string file_;
  int classes_, c_, h_, w_;
};

}  // namespace

std::shared_ptr<Dataset> make_list_dataset(ListFile list, const std::string& list_file, int num_classes, int channels,
                                           int height, int width) {
  return std::make_shared<RecListDataset>(std::move(list), list_file, num_classes, channels, height, width);
}

}  // namespace dtrain::apps::ocr
