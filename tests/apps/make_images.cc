// Small image data sets for the app tests, written with OpenCV:
//   dtrain-make-images cls DIR COUNT [SCALE]   a PaddleClas list (train.txt, val.txt) of non-square
//                                      RGB JPEG and PNG images of 3 classes (a red, green or blue
//                                      ellipse on a noisy background), sizes 40..80 x 30..70 times SCALE
//   dtrain-make-images seg DIR COUNT W H   a PaddleSeg list of W x H RGB PNGs and grey label PNGs:
//                                      background 0, rectangles 1, ellipses 2
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

namespace fs = std::filesystem;

namespace {

cv::Mat background(cv::RNG& rng, int h, int w) {
  cv::Mat m(h, w, CV_8UC3);
  cv::Scalar base(rng.uniform(30, 90), rng.uniform(30, 90), rng.uniform(30, 90));
  m.setTo(base);
  cv::Mat noise(h, w, CV_8UC3);
  rng.fill(noise, cv::RNG::UNIFORM, 0, 40);
  m += noise;
  return m;
}

int cls(const fs::path& dir, int count, int scale) {
  fs::create_directories(dir / "images");
  std::ofstream train(dir / "train.txt"), val(dir / "val.txt");
  cv::RNG rng(12345);
  for (int i = 0; i < count; ++i) {
    int label = i % 3, w = rng.uniform(40, 81) * scale, h = rng.uniform(30, 71) * scale;
    cv::Mat m = background(rng, h, w);
    cv::Scalar colour(0, 0, 0);
    colour[2 - label] = rng.uniform(180, 256);  // BGR: label 0 red, 1 green, 2 blue
    cv::ellipse(m, cv::Point(w / 2 + rng.uniform(-w / 6, w / 6 + 1), h / 2 + rng.uniform(-h / 6, h / 6 + 1)),
                cv::Size(w / 4 + rng.uniform(0, w / 6), h / 4 + rng.uniform(0, h / 6)), rng.uniform(0, 180), 0, 360,
                colour, cv::FILLED);
    std::string name = "images/" + std::to_string(i) + (i % 2 ? ".jpg" : ".png");
    if (!cv::imwrite((dir / name).string(), m)) return std::fprintf(stderr, "cannot write %s\n", name.c_str()), 1;
    (i % 5 == 4 ? val : train) << name << " " << label << "\n";
  }
  return 0;
}

int seg(const fs::path& dir, int count, int w, int h) {
  fs::create_directories(dir / "images");
  fs::create_directories(dir / "labels");
  std::ofstream train(dir / "train.txt"), val(dir / "val.txt");
  cv::RNG rng(4321);
  for (int i = 0; i < count; ++i) {
    cv::Mat m = background(rng, h, w), lab(h, w, CV_8UC1, cv::Scalar(0));
    for (int k = 0; k < 3; ++k) {
      int cls = 1 + int(rng.uniform(0, 2));
      cv::Point c(rng.uniform(0, w), rng.uniform(0, h));
      cv::Size s(rng.uniform(h / 8, h / 3), rng.uniform(h / 8, h / 3));
      cv::Scalar colour =
          cls == 1 ? cv::Scalar(40, rng.uniform(140, 220), 230) : cv::Scalar(230, 200, rng.uniform(40, 120));
      if (cls == 1) {
        cv::Rect r(c.x - s.width, c.y - s.height, 2 * s.width, 2 * s.height);
        cv::rectangle(m, r, colour, cv::FILLED);
        cv::rectangle(lab, r, cv::Scalar(1), cv::FILLED);
      } else {
        cv::ellipse(m, c, s, 0, 0, 360, colour, cv::FILLED);
        cv::ellipse(lab, c, s, 0, 0, 360, cv::Scalar(2), cv::FILLED);
      }
    }
    std::string img = "images/" + std::to_string(i) + ".png", lbl = "labels/" + std::to_string(i) + ".png";
    if (!cv::imwrite((dir / img).string(), m) || !cv::imwrite((dir / lbl).string(), lab))
      return std::fprintf(stderr, "cannot write %s\n", img.c_str()), 1;
    (i % 4 == 3 ? val : train) << img << " " << lbl << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "cls" && (argc == 4 || argc == 5))
    return cls(argv[2], std::atoi(argv[3]), argc == 5 ? std::atoi(argv[4]) : 1);
  if (mode == "seg" && argc == 6) return seg(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
  std::fprintf(stderr, "usage: dtrain-make-images cls DIR COUNT [SCALE] | seg DIR COUNT W H\n");
  return 2;
}
