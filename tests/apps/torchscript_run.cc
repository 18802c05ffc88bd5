// An app's export_model output, run by a plain libtorch C++ program (no dtrain):
//   torchscript_run MODEL.pt VERIFY_DIR
// loads the TorchScript file, runs the traced batch (VERIFY_DIR/input.f32) and
// compares with the output export_model wrote (VERIFY_DIR/output.f32).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <torch/script.h>

namespace {

std::vector<int64_t> shape_line(std::istream& in) {
  std::string line;
  std::getline(in, line);
  std::vector<int64_t> s;
  size_t pos = 0;
  while (pos < line.size()) {
    size_t used = 0;
    s.push_back(std::stoll(line.substr(pos), &used));
    pos += used;
    while (pos < line.size() && line[pos] == ' ') ++pos;
  }
  return s;
}

torch::Tensor read_f32(const std::string& path, const std::vector<int64_t>& shape) {
  auto t = torch::empty(shape, torch::kFloat);
  std::ifstream f(path, std::ios::binary);
  f.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * sizeof(float)));
  if (!f) throw std::runtime_error("cannot read " + path);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: torchscript_run MODEL.pt VERIFY_DIR\n");
    return 2;
  }
  try {
    const std::string dir = argv[2];
    std::ifstream shapes(dir + "/shapes.txt");
    auto in_shape = shape_line(shapes), out_shape = shape_line(shapes);
    auto x = read_f32(dir + "/input.f32", in_shape), want = read_f32(dir + "/output.f32", out_shape);
    auto module = torch::jit::load(argv[1]);
    module.eval();
    torch::NoGradGuard ng;
    auto got = module.forward({x}).toTensor();
    if (got.sizes() != want.sizes()) {
      std::cerr << "FAIL: output " << got.sizes() << ", export_model's " << want.sizes() << "\n";
      return 1;
    }
    const double diff = (got - want).abs().max().item<double>();
    std::cout << "libtorch C++: " << x.sizes() << " -> " << got.sizes() << ", max |diff| " << diff << "\n";
    return diff <= 1e-4 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "FAIL: " << e.what() << "\n";
    return 1;
  }
}
