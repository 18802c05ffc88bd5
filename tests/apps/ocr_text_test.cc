// The OCR app's pure parts: UTF-8 characters, the character dictionary and its
// errors, CTC greedy decoding, edit distance and PaddleOCR's metrics, the
// recognition list format and its errors, the word split, the renderer's
// determinism and PaddleOCR's resize-and-pad; the CRNN's output layout.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <opencv2/imgcodecs.hpp>

#include "dtrain/error.h"
#include "ocr/models.h"
#include "ocr/ocr.h"
#include "ocr/render.h"
#include "ocr/text.h"

// One unity source with its program's other files (dtrain_torch_gtests).
namespace ocr_text_test {

namespace fs = std::filesystem;
using namespace dtrain::apps::ocr;
using dtrain::InvalidUsage;

namespace {

class Tmp {
 public:
  Tmp() {
    char tmpl[] = "/tmp/ocr_text_test.XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  ~Tmp() { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) const {
    std::string p = (fs::path(dir_) / name).string();
    std::ofstream(p) << text;
    return p;
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

const char* kFont = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

}  // namespace

TEST(OcrText, Utf8Characters) {
  EXPECT_EQ(utf8_chars("ab"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(utf8_chars("na\xc3\xafve").size(), 5u);  // naïve
  EXPECT_EQ(utf8_chars("\xe2\x82\xac").size(), 1u);  // €
  EXPECT_THROW(utf8_chars("a\xc3"), InvalidUsage);
  EXPECT_THROW(utf8_chars("\xff"), InvalidUsage);
}

TEST(OcrText, DictionaryIdsStartAtOneAfterTheBlank) {
  Tmp t;
  CharDict d = CharDict::load(t.write("d.txt", "a\nb\r\n\xc3\xaf\n"), false);
  EXPECT_EQ(d.size(), 3u);
  EXPECT_EQ(d.num_classes(), 4);
  std::vector<int64_t> ids;
  std::string bad;
  ASSERT_TRUE(d.encode("ba\xc3\xaf", &ids, &bad));
  EXPECT_EQ(ids, (std::vector<int64_t>{2, 1, 3}));
  EXPECT_EQ(d.decode({0, 2, 1, 3, 9}), "ba\xc3\xaf");
  EXPECT_FALSE(d.encode("a c", &ids, &bad));
  EXPECT_EQ(bad, " ");
  CharDict s = CharDict::load(t.write("d2.txt", "a\nb\n"), true);
  EXPECT_EQ(s.size(), 3u);
  ASSERT_TRUE(s.encode("a b", &ids));
  EXPECT_EQ(ids, (std::vector<int64_t>{1, 3, 2}));
}

TEST(OcrText, DictionaryErrorsNameFileAndLine) {
  Tmp t;
  std::string dup = t.write("dup.txt", "a\nb\na\n");
  EXPECT_EQ(error_of([&] { CharDict::load(dup, false); }), dup + ":3: character 'a' is listed twice");
  std::string two = t.write("two.txt", "a\nbc\n");
  EXPECT_EQ(error_of([&] { CharDict::load(two, false); }),
            two + ":2: 'bc' is not one character (a dictionary line holds exactly one)");
  std::string empty = t.write("empty.txt", "a\n\nb\n");
  EXPECT_EQ(error_of([&] { CharDict::load(empty, false); }), empty + ":2: empty line in the character dictionary");
  EXPECT_NE(error_of([&] { CharDict::load(t.dir() + "/none.txt", false); }).find("cannot open character dictionary"),
            std::string::npos);
}

TEST(OcrText, BuiltinDictionaryIsTheShippedFile) {
  CharDict file = CharDict::load(std::string(DTRAIN_SOURCE_DIR) + "/apps/ocr/en_dict.txt", false);
  EXPECT_EQ(file.chars(), dtrain::apps::builtin_en_dict());
  EXPECT_EQ(file.size(), 94u);
}

TEST(OcrText, CtcGreedyCollapsesRepeatsThenDropsBlanks) {
  std::vector<int64_t> best{0, 1, 1, 0, 1, 2, 2, 0, 0, 3};
  EXPECT_EQ(ctc_greedy(best.data(), int64_t(best.size())), (std::vector<int64_t>{1, 1, 2, 3}));
  std::vector<int64_t> blanks{0, 0, 0};
  EXPECT_TRUE(ctc_greedy(blanks.data(), 3).empty());
  std::vector<int64_t> run{4, 4, 4};
  EXPECT_EQ(ctc_greedy(run.data(), 3), (std::vector<int64_t>{4}));
}

TEST(OcrText, EditDistanceCountsCharacters) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("abc", "abc"), 0u);
  EXPECT_EQ(edit_distance("na\xc3\xafve", "naive"), 1u);  // one character, two bytes
}

TEST(OcrText, MetricAsPaddleOcrRecMetric) {
  TextMetric m;
  EXPECT_TRUE(m.add("hello", "hello"));
  EXPECT_FALSE(m.add("Hello", "hello"));  // case-sensitive by default
  EXPECT_TRUE(m.add("a b", "ab"));        // ignore_space
  EXPECT_FALSE(m.add("abcd", "ab"));      // distance 2 / max(4, 2)
  EXPECT_TRUE(m.add("", ""));             // 0 for two empty strings
  EXPECT_DOUBLE_EQ(m.acc(), 3.0 / 5.0);
  EXPECT_DOUBLE_EQ(m.norm_edit_dis(), 1 - (0 + 0.2 + 0 + 0.5 + 0) / 5.0);
  TextMetric f;
  f.filter = true;
  EXPECT_TRUE(f.add("Hello!", "hello"));
}

TEST(OcrText, ListFormatAndItsErrors) {
  Tmp t;
  CharDict d = CharDict::from_chars({"a", "b", "c"}, "test");
  t.write("x.png", "");
  t.write("y.png", "");
  std::string ok = t.write("ok.txt", "x.png\tabc\n\ny.png\tb a\r\n");
  // "b a" has a space, not in this dictionary.
  EXPECT_EQ(error_of([&] { read_rec_list(ok, t.dir(), d, 25, false); }),
            ok + ":3: label 'b a' has the character ' ', which is not in the dictionary (data.unknown_chars = \"skip\" "
                 "skips such lines)");
  ListFile skipped = read_rec_list(ok, t.dir(), d, 25, true);
  ASSERT_EQ(skipped.entries.size(), 1u);
  EXPECT_EQ(skipped.skipped_unknown, 1u);
  EXPECT_EQ(skipped.entries[0].ids, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(skipped.entries[0].path, t.dir() + "/x.png");
  EXPECT_EQ(skipped.entries[0].line, 1);
  std::string notab = t.write("notab.txt", "x.png\tab\ny.png abc\n");
  EXPECT_EQ(error_of([&] { read_rec_list(notab, t.dir(), d, 25, false); }),
            notab + ":2: expected 'image_path<TAB>label', got 'y.png abc' (no tab)");
  std::string missing = t.write("missing.txt", "x.png\tab\nz.png\tab\n");
  EXPECT_EQ(error_of([&] { read_rec_list(missing, t.dir(), d, 25, true); }),
            missing + ":2: image '" + t.dir() + "/z.png' does not exist");
  std::string longer = t.write("long.txt", "x.png\tabcabc\n");
  EXPECT_EQ(error_of([&] { read_rec_list(longer, t.dir(), d, 4, false); }),
            longer + ":1: label 'abcabc' has 6 characters, more than data.max_text_length = 4");
  std::string empty = t.write("emptylabel.txt", "x.png\t\n");
  EXPECT_EQ(error_of([&] { read_rec_list(empty, t.dir(), d, 25, true); }), empty + ":1: empty label");
}

TEST(OcrRender, WordSplitIsDisjointAndDeterministic) {
  Tmp t;
  std::string words;
  for (int i = 0; i < 400; ++i) words += "w" + std::to_string(i) + "\n";
  words += "w1\nna\xc3\xafve\n";  // a repeat, and a word with a character outside the dictionary
  std::string file = t.write("words.txt", words);
  CharDict d = CharDict::from_chars(dtrain::apps::builtin_en_dict(), "en");
  WordSplit a = split_words(file, d, 1, 12, 20), b = split_words(file, d, 1, 12, 20);
  EXPECT_EQ(a.train, b.train);
  EXPECT_EQ(a.test, b.test);
  EXPECT_EQ(a.train.size() + a.test.size(), 400u);
  EXPECT_EQ(a.dropped, 1u);
  std::set<std::string> train(a.train.begin(), a.train.end());
  for (const auto& w : a.test) EXPECT_EQ(train.count(w), 0u) << w;
  EXPECT_GT(a.test.size(), 40u);
  EXPECT_LT(a.test.size(), 120u);
}

TEST(OcrRender, SameSeedSamePixels) {
  if (!fs::exists(kFont)) GTEST_FAIL() << kFont << " missing (scripts/setup.sh installs fonts-dejavu-core)";
  RenderOptions o;
  cv::Mat a = render_text("Quartz's", kFont, 7, o), b = render_text("Quartz's", kFont, 7, o),
          c = render_text("Quartz's", kFont, 8, o);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(cv::norm(a, b, cv::NORM_L1), 0.0);
  EXPECT_TRUE(a.size() != c.size() || cv::norm(a, c, cv::NORM_L1) > 0);
  EXPECT_EQ(a.type(), CV_8UC1);
  EXPECT_GT(a.cols, a.rows);  // a word is wider than high
  EXPECT_TRUE(missing_glyphs(kFont, {"a", "'", "Z"}).empty());
  EXPECT_EQ(error_of([&] { render_text("a", "/nonexistent.ttf", 1, o); }),
            "cannot load font '/nonexistent.ttf' (missing, or not a font FreeType reads)");
}

// Pixels nearer the text's grey than the background's (the background is the
// image's most common value: no noise, texture or blur below).
int ink_pixels(const cv::Mat& m) {
  int hist[256] = {0};
  for (int y = 0; y < m.rows; ++y)
    for (int x = 0; x < m.cols; ++x) ++hist[m.at<uint8_t>(y, x)];
  int bg = int(std::max_element(hist, hist + 256) - hist), ink = 0;
  for (int y = 0; y < m.rows; ++y)
    for (int x = 0; x < m.cols; ++x) ink += std::abs(int(m.at<uint8_t>(y, x)) - bg) > 100;
  return ink;
}

TEST(OcrRender, StrokeAndStretchChangeTheShapesOnlyWhenEnabled) {
  if (!fs::exists(kFont)) GTEST_FAIL() << kFont << " missing (scripts/setup.sh installs fonts-dejavu-core)";
  RenderOptions plain;
  plain.slant = plain.rotate = plain.blur = plain.noise = plain.texture = 0;
  plain.min_contrast = 200;
  RenderOptions shaped = plain;
  shaped.stroke = 0.1;
  shaped.stretch = 0.5;
  RenderOptions off = plain;  // enabled at 0: the same pixels as a job without the keys
  off.stroke = off.stretch = 0;
  int bolder = 0, thinner = 0, wider = 0, narrower = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    cv::Mat a = render_text("mmmm", kFont, seed, plain), b = render_text("mmmm", kFont, seed, shaped);
    ASSERT_EQ(cv::norm(a, render_text("mmmm", kFont, seed, off), cv::NORM_L1), 0.0);
    double ink = double(ink_pixels(b)) / ink_pixels(a), width = double(b.cols) / a.cols;
    // Per pixel of width: the margins and the stretch aside, emboldening adds ink, thinning takes it away.
    double density = ink / width;
    bolder += density > 1.25;
    thinner += density < 0.8;
    // The crop margins alone move the width by at most ~1.18x for these four letters.
    wider += width > 1.25;
    narrower += width < 0.8;
  }
  EXPECT_GE(bolder, 3);
  EXPECT_GE(thinner, 3);
  EXPECT_GE(wider, 2);
  EXPECT_GE(narrower, 2);
}

TEST(OcrRender, ModelInputResizesToHeightAndPadsRightWithMidGrey) {
  cv::Mat wide(20, 200, CV_8UC1, cv::Scalar(10)), narrow(40, 40, CV_8UC1, cv::Scalar(10));
  auto w = dtrain::apps::ocr::model_input(wide, 1, 32, 128);
  EXPECT_EQ(w.height, 32);
  EXPECT_EQ(w.width, 128);
  EXPECT_EQ(w.pixels[127], 10);  // squeezed to the full width
  auto n = dtrain::apps::ocr::model_input(narrow, 3, 32, 128);
  EXPECT_EQ(n.channels, 3);
  EXPECT_EQ(n.pixels[31], 10);   // 32 columns of image (aspect 1)
  EXPECT_EQ(n.pixels[32], 128);  // then padding
  EXPECT_EQ(n.pixels.size(), size_t(3 * 32 * 128));
}

TEST(OcrModel, BothBackbonesGiveOneStepPerFourColumns) {
  for (const char* backbone : {"vgg", "mobilenetv3"}) {
    auto net = make_crnn(backbone, 1, 16, 24, 2, 11);
    net->eval();
    ::torch::NoGradGuard ng;
    auto out = net->forward(::torch::randn({3, 1, 32, 96}));
    EXPECT_EQ(out.sizes(), (std::vector<int64_t>{24, 3, 11})) << backbone;
  }
  EXPECT_EQ(error_of([] { make_crnn("resnet", 1, 16, 24, 2, 11); }),
            "unknown backbone 'resnet'; known backbones: vgg, mobilenetv3");
}

}  // namespace ocr_text_test
