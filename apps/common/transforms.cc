#include "common/transforms.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::apps {

struct Transforms::Op {
  enum Kind { Noop, RandCrop, Resize, ResizeShort, CenterCrop, Flip, Normalize, StepScaling, PaddingCrop };
  Kind kind = Noop;
  std::string name, text;
  int w = 0, h = 0, resize_short = 0;
  double lo = 0, hi = 0, ratio_lo = 0, ratio_hi = 0, step = 0;
  int flip_code = 1;
  double prob = 0.5;
  bool coin = false;  // RandFlipImage: half the samples (random.randint(0, 1)); else prob
  int im_pad = 128, label_pad = 255;
};

Transforms::Transforms() = default;
Transforms::~Transforms() = default;

namespace {

[[noreturn]] void bad(const Config& c, const std::string& key, const std::string& msg) {
  ConfigLocation loc = c.location_of(key);
  throw ConfigError(loc.file, loc.line, loc.column, key, msg);
}

struct OpSpec {
  Transforms::Op::Kind kind;
  std::vector<std::string> params;
};

const std::map<std::string, OpSpec>& specs(Transforms::Flavour f) {
  using K = Transforms::Op;
  static const std::map<std::string, OpSpec> cls = {
      {"DecodeImage", {K::Noop, {"to_rgb", "channel_first"}}},
      {"RandCropImage", {K::RandCrop, {"size", "scale", "ratio", "interpolation"}}},
      {"ResizeImage", {K::Resize, {"size", "resize_short", "interpolation"}}},
      {"CropImage", {K::CenterCrop, {"size"}}},
      {"RandFlipImage", {K::Flip, {"flip_code"}}},
      {"NormalizeImage", {K::Normalize, {"scale", "mean", "std", "order", "output_fp16", "channel_num"}}},
      {"ToCHWImage", {K::Noop, {}}},
  };
  static const std::map<std::string, OpSpec> seg = {
      {"ResizeStepScaling", {K::StepScaling, {"min_scale_factor", "max_scale_factor", "scale_step_size"}}},
      {"RandomPaddingCrop", {K::PaddingCrop, {"crop_size", "im_padding_value", "label_padding_value"}}},
      {"Resize", {K::Resize, {"target_size", "interp"}}},
      {"RandomHorizontalFlip", {K::Flip, {"prob"}}},
      {"RandomVerticalFlip", {K::Flip, {"prob"}}},
      {"Normalize", {K::Normalize, {"mean", "std"}}},
  };
  return f == Transforms::Flavour::Cls ? cls : seg;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// An integer (a square) or [w, h].
std::pair<int, int> read_size(const Config& c, const std::string& key) {
  std::vector<int64_t> v;
  try {
    int64_t n = c.get_int(key);
    v = {n, n};
  } catch (const ConfigError&) {
    try {
      v = c.get_int_list(key);
    } catch (const ConfigError&) {
      bad(c, key, "must be an integer or [width, height]");
    }
    if (v.size() != 2)
      bad(c, key, "must be an integer or [width, height], got " + std::to_string(v.size()) + " values");
  }
  if (v[0] < 1 || v[1] < 1 || v[0] > 65536 || v[1] > 65536) bad(c, key, "sizes must be in [1, 65536]");
  return {int(v[0]), int(v[1])};
}

// A number, or a fraction written as PaddleClas's YAML does: "1.0/255.0".
double read_number(const Config& c, const std::string& key) {
  try {
    return c.get_float(key);
  } catch (const ConfigError&) {
  }
  std::string s;
  try {
    s = c.get_string(key);
  } catch (const ConfigError&) {
    bad(c, key, "must be a number or a fraction such as \"1.0/255.0\"");
  }
  try {
    size_t slash = s.find('/'), used = 0;
    double num = std::stod(s.substr(0, slash), &used);
    if (slash == std::string::npos) {
      if (used != s.size()) throw std::invalid_argument(s);
      return num;
    }
    std::string d = s.substr(slash + 1);
    double den = std::stod(d, &used);
    if (used != d.size() || den == 0) throw std::invalid_argument(s);
    return num / den;
  } catch (const std::exception&) {
    bad(c, key, "'" + s + "' is not a number or a fraction such as \"1.0/255.0\"");
  }
}

std::vector<double> read_floats(const Config& c, const std::string& key, size_t min_n, size_t max_n) {
  std::vector<double> v = c.get_float_list(key);
  if (v.size() < min_n || v.size() > max_n)
    bad(c, key,
        max_n == min_n ? fmt::format("needs {} values, got {}", min_n, v.size())
                       : fmt::format("needs {} to {} values, got {}", min_n, max_n, v.size()));
  return v;
}

std::string list_text(const std::vector<double>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{:.4g}", i ? ", " : "", v[i]);
  return s + "]";
}

double uniform(std::mt19937_64& gen, double a, double b) {
  return a + (b - a) * double(gen() >> 11) * (1.0 / 9007199254740992.0);
}
int randint(std::mt19937_64& gen, int lo, int hi) {  // inclusive, as Python's random.randint
  return hi <= lo ? lo : lo + int(gen() % uint64_t(hi - lo + 1));
}

}  // namespace

std::shared_ptr<const Transforms> Transforms::from_config(const Config& c, const std::string& path, Flavour flavour) {
  if (!c.has(path)) return nullptr;
  auto t = std::make_shared<Transforms>();
  t->path_ = path;
  const auto& known = specs(flavour);
  std::vector<std::string> names;
  for (const auto& [name, spec] : known) names.push_back(name);
  const std::vector<std::string> ops = c.keys_of(path);
  if (ops.empty()) bad(c, path, "lists no operators; known: " + join(names));
  bool normalized = false;
  for (const std::string& name : ops) {
    const std::string key = path + "." + name;
    auto it = known.find(name);
    if (it == known.end()) {
      std::string near = closest_match(name, names);
      bad(c, key,
          "unknown operator '" + name + "'" + (near.empty() ? "" : "; did you mean '" + near + "'?") +
              " (known: " + join(names) + ")");
    }
    if (normalized && name != "ToCHWImage")
      bad(c, key, "comes after the normalize operator; normalization must be the last operator");
    Op op;
    op.kind = it->second.kind;
    op.name = name;
    const std::vector<std::string> params = c.keys_of(key);
    for (const std::string& p : params)
      if (std::find(it->second.params.begin(), it->second.params.end(), p) == it->second.params.end()) {
        const auto& allowed = it->second.params;
        std::string near = closest_match(p, allowed);
        bad(c, key + "." + p,
            "unknown parameter '" + p + "' of " + name + (near.empty() ? "" : "; did you mean '" + near + "'?") +
                (allowed.empty() ? " (it takes none)" : " (known: " + join(allowed) + ")"));
      }
    auto has = [&](const char* p) { return std::find(params.begin(), params.end(), p) != params.end(); };
    auto k = [&](const char* p) { return key + "." + p; };
    for (const char* p : {"interpolation", "interp"})
      if (has(p)) {
        std::string v = c.get_string(k(p));
        if (v != "bilinear" && v != "LINEAR" && v != "linear")
          bad(c, k(p), "'" + v + "' is not available: images are resized bilinearly (\"bilinear\" or \"LINEAR\")");
      }
    auto probability = [&](const char* p, double def) {
      double v = has(p) ? c.get_float(k(p)) : def;
      if (!(v >= 0 && v <= 1)) bad(c, k(p), "must be in [0, 1]");
      return v;
    };
    switch (op.kind) {
      case Op::Noop:
        if (has("to_rgb")) c.get_bool(k("to_rgb"));
        if (has("channel_first") && c.get_bool(k("channel_first")))
          bad(c, k("channel_first"), "must be false: operators work on HWC images, as PaddleClas's defaults");
        break;
      case Op::RandCrop: {
        if (!has("size")) bad(c, key, "RandCropImage needs size");
        std::tie(op.w, op.h) = read_size(c, k("size"));
        std::vector<double> s = has("scale") ? read_floats(c, k("scale"), 2, 2) : std::vector<double>{0.08, 1.0};
        std::vector<double> r =
            has("ratio") ? read_floats(c, k("ratio"), 2, 2) : std::vector<double>{3.0 / 4.0, 4.0 / 3.0};
        if (!(s[0] > 0 && s[0] <= s[1] && s[1] <= 1)) bad(c, k("scale"), "needs 0 < min <= max <= 1");
        if (!(r[0] > 0 && r[0] <= r[1])) bad(c, k("ratio"), "needs 0 < min <= max");
        op.lo = s[0], op.hi = s[1], op.ratio_lo = r[0], op.ratio_hi = r[1];
        op.text = fmt::format("size {}x{} scale {} ratio {}", op.w, op.h, list_text(s), list_text(r));
        break;
      }
      case Op::Resize:
        if (flavour == Flavour::Seg) {
          std::tie(op.w, op.h) = has("target_size") ? read_size(c, k("target_size")) : std::pair<int, int>{512, 512};
          op.text = fmt::format("target_size {}x{}", op.w, op.h);
        } else if (has("resize_short") == has("size")) {
          bad(c, key, "ResizeImage needs one of resize_short and size");
        } else if (has("resize_short")) {
          op.kind = Op::ResizeShort;
          op.resize_short = static_cast<int>(c.get_int(k("resize_short")));
          if (op.resize_short < 1) bad(c, k("resize_short"), "must be >= 1");
          op.text = fmt::format("resize_short {}", op.resize_short);
        } else {
          std::tie(op.w, op.h) = read_size(c, k("size"));
          op.text = fmt::format("size {}x{}", op.w, op.h);
        }
        break;
      case Op::CenterCrop:
        if (!has("size")) bad(c, key, "CropImage needs size");
        std::tie(op.w, op.h) = read_size(c, k("size"));
        op.text = fmt::format("size {}x{}", op.w, op.h);
        break;
      case Op::Flip:
        if (flavour == Flavour::Cls) {
          op.coin = true;
          op.flip_code = has("flip_code") ? static_cast<int>(c.get_int(k("flip_code"))) : 1;
          if (op.flip_code < -1 || op.flip_code > 1)
            bad(c, k("flip_code"), "must be 1 (horizontal), 0 (vertical) or -1 (both)");
        } else {
          op.flip_code = name == "RandomVerticalFlip" ? 0 : 1;
          op.prob = probability("prob", name == "RandomVerticalFlip" ? 0.1 : 0.5);
        }
        op.text = flavour == Flavour::Cls ? fmt::format("flip_code {}", op.flip_code) : fmt::format("prob {}", op.prob);
        break;
      case Op::Normalize: {
        const bool cls = flavour == Flavour::Cls;
        t->scale_ = has("scale") ? read_number(c, k("scale")) : 1.0 / 255.0;
        // The defaults of PaddleClas's NormalizeImage (ImageNet's) and of PaddleSeg's Normalize.
        const std::vector<double> mean = cls ? std::vector<double>{0.485, 0.456, 0.406} : std::vector<double>(3, 0.5);
        const std::vector<double> stdv = cls ? std::vector<double>{0.229, 0.224, 0.225} : std::vector<double>(3, 0.5);
        t->mean_ = has("mean") ? read_floats(c, k("mean"), 1, 4) : mean;
        t->std_ = has("std") ? read_floats(c, k("std"), 1, 4) : stdv;
        for (double s : t->std_)
          if (!(s > 0)) bad(c, has("std") ? k("std") : key, "std values must be > 0");
        if (has("order")) {
          std::string o = c.get_string(k("order"));
          if (o != "" && o != "hwc" && o != "chw") bad(c, k("order"), "must be \"\", \"hwc\" or \"chw\"");
        }
        if (has("output_fp16") && c.get_bool(k("output_fp16")))
          bad(c, k("output_fp16"), "must be false: batches are float32 (train.bf16 casts inside the model)");
        if (has("channel_num")) c.get_int(k("channel_num"));
        op.text = fmt::format("scale {:.6g} mean {} std {}", t->scale_, list_text(t->mean_), list_text(t->std_));
        normalized = true;
        t->normalize_key_ = key;
        break;
      }
      case Op::StepScaling: {
        op.lo = has("min_scale_factor") ? c.get_float(k("min_scale_factor")) : 0.75;
        op.hi = has("max_scale_factor") ? c.get_float(k("max_scale_factor")) : 1.25;
        op.step = has("scale_step_size") ? c.get_float(k("scale_step_size")) : 0.25;
        if (!(op.lo > 0)) bad(c, k("min_scale_factor"), "must be > 0");
        if (op.hi < op.lo) bad(c, has("max_scale_factor") ? k("max_scale_factor") : key, "must be >= min_scale_factor");
        if (op.step < 0) bad(c, k("scale_step_size"), "must be >= 0");
        op.text = fmt::format("min {} max {} step {}", op.lo, op.hi, op.step);
        break;
      }
      case Op::PaddingCrop: {
        std::tie(op.w, op.h) = has("crop_size") ? read_size(c, k("crop_size")) : std::pair<int, int>{512, 512};
        double ip = has("im_padding_value") ? c.get_float(k("im_padding_value")) : 127.5;
        int64_t lp = has("label_padding_value") ? c.get_int(k("label_padding_value")) : 255;
        if (!(ip >= 0 && ip <= 255)) bad(c, k("im_padding_value"), "must be in [0, 255]");
        if (lp < 0 || lp > 255) bad(c, k("label_padding_value"), "must be in [0, 255]");
        op.im_pad = static_cast<int>(std::nearbyint(ip));
        op.label_pad = static_cast<int>(lp);
        op.text = fmt::format("crop_size {}x{} im_padding_value {} label_padding_value {}", op.w, op.h, op.im_pad,
                              op.label_pad);
        break;
      }
      default: break;
    }
    t->ops_.push_back(std::move(op));
  }
  return t;
}

void Transforms::check_channels(const Config& c, int channels) const {
  for (const auto* v : {&mean_, &std_})
    if (v->size() != 1 && int(v->size()) != channels)
      bad(c, normalize_key_.empty() ? path_ : normalize_key_,
          fmt::format("{} has {} values but the images have {} channel(s) (data.channels)",
                      v == &mean_ ? "mean" : "std", v->size(), channels));
}

void read_transforms(const Config& c, Transforms::Flavour flavour, int channels, AugmentOptions& a) {
  a.train_transforms = Transforms::from_config(c, "data.train.transforms", flavour);
  a.eval_transforms = Transforms::from_config(c, "data.eval.transforms", flavour);
  if (bool(a.train_transforms) != bool(a.eval_transforms))
    bad(c, a.train_transforms ? "data.train.transforms" : "data.eval.transforms",
        std::string("is given without [") + (a.train_transforms ? "data.eval.transforms" : "data.train.transforms") +
            "]: write both (the evaluation's at least normalizes as training does)");
  for (const auto& t : {a.train_transforms, a.eval_transforms})
    if (t) t->check_channels(c, channels);
}

std::string Transforms::describe() const {
  std::string s;
  for (const Op& op : ops_) s += (s.empty() ? "" : " -> ") + op.name + (op.text.empty() ? "" : "(" + op.text + ")");
  return s;
}

std::vector<uint8_t> resize_bilinear(const std::vector<uint8_t>& src, int C, int h, int w, int oh, int ow) {
  if (oh == h && ow == w) return src;
  auto axis = [](int n, int on, std::vector<int>& i0, std::vector<float>& f) {
    i0.resize(size_t(on));
    f.resize(size_t(on));
    const double s = double(n) / on;
    for (int o = 0; o < on; ++o) {
      double p = std::max(0.0, (o + 0.5) * s - 0.5);
      int i = std::min(int(p), n - 1);
      i0[size_t(o)] = i;
      f[size_t(o)] = i >= n - 1 ? 0.0f : float(p - i);
    }
  };
  std::vector<int> xi, yi;
  std::vector<float> xf, yf;
  axis(w, ow, xi, xf);
  axis(h, oh, yi, yf);
  std::vector<uint8_t> out(size_t(C) * oh * ow);
  for (int c = 0; c < C; ++c) {
    const uint8_t* p = src.data() + size_t(c) * h * w;
    uint8_t* o = out.data() + size_t(c) * oh * ow;
    for (int y = 0; y < oh; ++y) {
      const uint8_t* r0 = p + size_t(yi[size_t(y)]) * w;
      const uint8_t* r1 = yi[size_t(y)] + 1 < h ? r0 + w : r0;
      const float fy = yf[size_t(y)];
      for (int x = 0; x < ow; ++x) {
        const int x0 = xi[size_t(x)], x1 = x0 + 1 < w ? x0 + 1 : x0;
        const float fx = xf[size_t(x)];
        float top = r0[x0] + fx * (r0[x1] - r0[x0]), bottom = r1[x0] + fx * (r1[x1] - r1[x0]);
        o[size_t(y) * ow + x] = static_cast<uint8_t>(std::lround(std::clamp(top + fy * (bottom - top), 0.0f, 255.0f)));
      }
    }
  }
  return out;
}

std::vector<uint8_t> resize_nearest(const std::vector<uint8_t>& src, int C, int h, int w, int oh, int ow) {
  if (oh == h && ow == w) return src;
  std::vector<uint8_t> out(size_t(C) * oh * ow);
  for (int c = 0; c < C; ++c)
    for (int y = 0; y < oh; ++y) {
      const int sy = std::min(int(std::floor(y * double(h) / oh)), h - 1);
      for (int x = 0; x < ow; ++x) {
        const int sx = std::min(int(std::floor(x * double(w) / ow)), w - 1);
        out[(size_t(c) * oh + y) * ow + x] = src[(size_t(c) * h + sy) * w + sx];
      }
    }
  return out;
}

Transforms::Output Transforms::apply(const Image& in, uint64_t seed) const {
  std::mt19937_64 gen(seed);
  const int C = in.channels;
  int H = in.height, W = in.width;
  std::vector<uint8_t> px = in.pixels, mask = in.mask;
  const bool dense = !mask.empty();
  auto resize = [&](int nh, int nw) {
    px = resize_bilinear(px, C, H, W, nh, nw);
    if (dense) mask = resize_nearest(mask, 1, H, W, nh, nw);
    H = nh, W = nw;
  };
  // The region [y0, y0 + ch) x [x0, x0 + cw); outside the image: the padding values.
  auto crop = [&](int y0, int x0, int ch, int cw, int im_pad, int label_pad) {
    std::vector<uint8_t> p(size_t(C) * ch * cw, uint8_t(im_pad)), m(dense ? size_t(ch) * cw : 0, uint8_t(label_pad));
    for (int y = 0; y < ch; ++y) {
      int sy = y0 + y;
      if (sy < 0 || sy >= H) continue;
      int xa = std::max(0, -x0), xb = std::min(cw, W - x0);
      if (xb <= xa) continue;
      for (int c = 0; c < C; ++c)
        std::copy_n(px.data() + (size_t(c) * H + sy) * W + x0 + xa, xb - xa, p.data() + (size_t(c) * ch + y) * cw + xa);
      if (dense) std::copy_n(mask.data() + size_t(sy) * W + x0 + xa, xb - xa, m.data() + size_t(y) * cw + xa);
    }
    px.swap(p), mask.swap(m);
    H = ch, W = cw;
  };
  auto flip = [&](int code) {
    auto one = [&](std::vector<uint8_t>& v, int planes) {
      for (int c = 0; c < planes; ++c) {
        uint8_t* p = v.data() + size_t(c) * H * W;
        if (code != 0)
          for (int y = 0; y < H; ++y) std::reverse(p + size_t(y) * W, p + size_t(y + 1) * W);
        if (code <= 0)
          for (int y = 0; y < H / 2; ++y)
            std::swap_ranges(p + size_t(y) * W, p + size_t(y + 1) * W, p + size_t(H - 1 - y) * W);
      }
    };
    one(px, C);
    if (dense) one(mask, 1);
  };

  for (const Op& op : ops_) {
    switch (op.kind) {
      case Op::RandCrop: {
        // PaddleClas's RandCropImage: aspect ratio and area drawn, bounded so the crop fits.
        double ar = std::sqrt(uniform(gen, op.ratio_lo, op.ratio_hi));
        double wr = ar, hr = 1.0 / ar;
        double bound = std::min((double(W) / H) / (wr * wr), (double(H) / W) / (hr * hr));
        double smax = std::min(op.hi, bound), smin = std::min(op.lo, bound);
        double side = std::sqrt(double(W) * H * uniform(gen, smin, smax));
        int cw = std::clamp(int(side * wr), 1, W), ch = std::clamp(int(side * hr), 1, H);
        int x0 = randint(gen, 0, W - cw), y0 = randint(gen, 0, H - ch);
        crop(y0, x0, ch, cw, 0, 0);
        resize(op.h, op.w);
        break;
      }
      case Op::Resize: resize(op.h, op.w); break;
      case Op::ResizeShort: {
        double f = double(op.resize_short) / std::min(W, H);
        resize(std::max(1, int(std::nearbyint(H * f))), std::max(1, int(std::nearbyint(W * f))));
        break;
      }
      case Op::CenterCrop:
        if (op.w > W || op.h > H)
          throw InvalidUsage(
              fmt::format("{}: size {}x{} is larger than the {}x{} image (resize it first, e.g. "
                          "ResizeImage resize_short)",
                          op.name, op.w, op.h, W, H));
        crop((H - op.h) / 2, (W - op.w) / 2, op.h, op.w, 0, 0);
        break;
      case Op::Flip:
        if (op.coin ? randint(gen, 0, 1) == 1 : uniform(gen, 0, 1) < op.prob) flip(op.flip_code);
        break;
      case Op::StepScaling: {
        double f = op.lo;
        if (op.hi > op.lo) {
          if (op.step == 0) {
            f = uniform(gen, op.lo, op.hi);
          } else {
            int steps = int((op.hi - op.lo) / op.step + 1);
            f = steps > 1 ? op.lo + (op.hi - op.lo) * randint(gen, 0, steps - 1) / (steps - 1) : op.lo;
          }
        }
        resize(std::max(1, int(std::nearbyint(f * H))), std::max(1, int(std::nearbyint(f * W))));
        break;
      }
      case Op::PaddingCrop: {
        if (H == op.h && W == op.w) break;
        int ph = std::max(H, op.h), pw = std::max(W, op.w);  // padded at the bottom and right
        int y0 = randint(gen, 0, ph - op.h), x0 = randint(gen, 0, pw - op.w);
        crop(y0, x0, op.h, op.w, op.im_pad, op.label_pad);
        break;
      }
      default: break;
    }
  }

  if (mean_.size() != 1 && int(mean_.size()) != C)
    throw InvalidUsage(fmt::format("normalize: mean has {} values but the images have {} channel(s)", mean_.size(), C));
  if (std_.size() != 1 && int(std_.size()) != C)
    throw InvalidUsage(fmt::format("normalize: std has {} values but the images have {} channel(s)", std_.size(), C));
  Output out{C, H, W, std::vector<float>(px.size()), std::move(mask)};
  const size_t plane = size_t(H) * W;
  for (int c = 0; c < C; ++c) {
    const float m = float(mean_[mean_.size() == 1 ? 0 : size_t(c)]);
    const float s = float(std_[std_.size() == 1 ? 0 : size_t(c)]);
    const float a = float(scale_) / s, b = m / s;
    const uint8_t* p = px.data() + c * plane;
    float* o = out.pixels.data() + c * plane;
    for (size_t i = 0; i < plane; ++i) o[i] = float(p[i]) * a - b;
  }
  return out;
}

}  // namespace dtrain::apps
