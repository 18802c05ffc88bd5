// Part files and the MANIFEST of a table save.
//
// A save of one table is a directory: dir/<table>/MANIFEST plus one part file
// per server, part-<generation>-<server>-of-<S>.bin|.txt. Every file is
// written as <name>.tmp, fsync'd, renamed and the directory fsync'd; the
// MANIFEST is written last (by the client, once every server wrote its part),
// so a directory whose save was interrupted still holds the previous
// MANIFEST and the parts it lists. After a new MANIFEST is in place, the part
// and temporary files it does not list are removed.
//
// Binary part file (DT_PS_FORMAT_BINARY): little-endian, no padding.
//   header, 96 bytes:
//      0 char[8] "DTPSPART"        40 u64 dim
//      8 u32 version (1)           48 u64 count: sparse rows / dense values in this part
//     12 u32 kind (DT_PS_TABLE_*)  56 u64 dense_begin: global index of the first value (sparse: 0)
//     16 u32 optimizer (DT_PS_OPT_*)   64 u64 table_t: dense Adam's step count (else 0)
//     20 u32 save mode (DT_PS_SAVE_*)  72 u64[3] reserved, 0
//     24 u32 server that wrote it
//     28 u32 number of servers at save time
//     32 u32 state: sparse: state floats per row; dense: state arrays (0 unless FULL)
//     36 u32 reserved, 0
//   sparse body: count records of 28 + 4 * (dim + state) bytes:
//     u64 key, f32 show, f32 click, u32 unseen_days,
//     u32 flags (bit 0: changed since the last BASE/DELTA save), u32 t (the row's Adam steps),
//     f32 values[dim], f32 state[state] (FULL: adagrad [g2sum]; adam [m0..m(dim-1), v0..v(dim-1)])
//   dense body: f32 values[count], then one f32[count] per state array (adagrad: g2sum;
//     adam: m, then v)
//   trailer: "DTPSEND1". A file must be exactly 96 + body + 8 bytes long.
//
// Text part file (DT_PS_FORMAT_TEXT), Paddle-readable: no header, one line per
// row or value, numbers separated by one space in their shortest round-trip
// form (so a text save reloads exactly).
//   sparse: key v0 .. v(dim-1) show click unseen_days changed [state]
//           state (FULL only): adagrad: g2sum; adam: t m0..m(dim-1) v0..v(dim-1)
//   dense:  value [state], in global index order; the part holds
//           [dense_begin, dense_end)(dim, server) of a Sharding with its file name's S
//           state (FULL only): adagrad: g2sum; adam: m v t
//
// MANIFEST (text, "key = value" lines, '#' comments):
//   version = 1, table, kind (dense|sparse), dim, optimizer (sgd|adagrad|adam),
//   mode (full|base|delta), format (binary|text), num_servers, generation,
//   and one "file = <part file>" line per part.

#include "engine/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>

#include "dtrain/sdk/error.h"
#include "dtrain/sdk/strings.h"

namespace dtrain::ps_grpc {

void fail_io(const std::string& what, const std::string& path) {
  const int e = errno;
  sdk::fail(DT_ERR_SYSTEM, what + " " + path + ": " + std::strerror(e));
}

void fail_file(const std::string& path, const std::string& what) { sdk::fail(DT_ERR_SYSTEM, path + ": " + what); }

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_io("cannot open the directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail_io("cannot fsync the directory", dir);
}

namespace {

void write_all(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_io("cannot write", path);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

AtomicWriter::AtomicWriter(const std::string& dir, const std::string& name)
    : dir_(dir), tmp_(dir + "/" + name + ".tmp"), final_(dir + "/" + name), buf_(1 << 20) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail_io("cannot create", tmp_);
}

AtomicWriter::~AtomicWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicWriter::flush() {
  write_all(fd_, buf_.data(), used_, tmp_);
  used_ = 0;
}

void AtomicWriter::flush_some(const void* p, size_t n) {
  flush();
  if (n >= buf_.size())
    write_all(fd_, static_cast<const char*>(p), n, tmp_);
  else {
    std::memcpy(buf_.data(), p, n);
    used_ = n;
  }
}

void AtomicWriter::overwrite(uint64_t offset, const void* p, size_t n) {
  flush();
  if (::pwrite(fd_, p, n, static_cast<off_t>(offset)) != static_cast<ssize_t>(n)) fail_io("cannot write", tmp_);
}

void AtomicWriter::commit() {
  flush();
  if (::fsync(fd_) != 0) fail_io("cannot fsync", tmp_);
  if (::close(fd_) != 0) {
    fd_ = -1;
    fail_io("cannot close", tmp_);
  }
  fd_ = -1;
  if (::rename(tmp_.c_str(), final_.c_str()) != 0) fail_io("cannot rename " + tmp_ + " to", final_);
  committed_ = true;
  fsync_dir(dir_);
}

FileReader::FileReader(const std::string& path) : path_(path), buf_(1 << 20) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail_io("cannot open", path);
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail_io("cannot stat", path);
  size_ = static_cast<uint64_t>(st.st_size);
}

FileReader::~FileReader() {
  if (fd_ >= 0) ::close(fd_);
}

bool FileReader::fill() {
  if (begin_ < end_) return true;
  for (;;) {
    const ssize_t r = ::read(fd_, buf_.data(), buf_.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail_io("cannot read", path_);
    begin_ = 0;
    end_ = static_cast<size_t>(r);
    return r > 0;
  }
}

void FileReader::read(void* p, size_t n) {
  char* out = static_cast<char*>(p);
  const uint64_t at = consumed_;
  while (n > 0) {
    if (!fill())
      fail_file(path_, "truncated: it ends at byte " + std::to_string(consumed_) +
                           " inside a record that starts at byte " + std::to_string(at));
    const size_t k = std::min(n, end_ - begin_);
    std::memcpy(out, buf_.data() + begin_, k);
    begin_ += k;
    consumed_ += k;
    out += k;
    n -= k;
  }
}

bool FileReader::getline(std::string_view& out) {
  carry_.clear();
  for (;;) {
    if (!fill()) {
      if (carry_.empty()) return false;
      ++line_;
      out = carry_;
      return true;
    }
    const char* b = buf_.data() + begin_;
    const void* nl = std::memchr(b, '\n', end_ - begin_);
    if (nl) {
      const size_t k = static_cast<const char*>(nl) - b;
      begin_ += k + 1;
      consumed_ += k + 1;
      ++line_;
      if (carry_.empty())
        out = std::string_view(b, k);
      else {
        carry_.append(b, k);
        out = carry_;
      }
      return true;
    }
    carry_.append(b, end_ - begin_);
    consumed_ += end_ - begin_;
    begin_ = end_;
  }
}

namespace {

void put32(char* p, uint32_t v) { std::memcpy(p, &v, 4); }
void put64(char* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t get32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t get64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the binary part format is little-endian");

}  // namespace

void PartHeader::encode(char* out) const {
  std::memset(out, 0, kBytes);
  std::memcpy(out, "DTPSPART", 8);
  put32(out + 8, 1);
  put32(out + 12, kind);
  put32(out + 16, optimizer);
  put32(out + 20, save_mode);
  put32(out + 24, server);
  put32(out + 28, num_servers);
  put32(out + 32, state);
  put64(out + 40, dim);
  put64(out + 48, count);
  put64(out + 56, dense_begin);
  put64(out + 64, table_t);
}

PartHeader PartHeader::of(int kind, int optimizer, int save_mode, int server, int num_servers, uint64_t state,
                          uint64_t dim) {
  PartHeader h;
  h.kind = static_cast<uint32_t>(kind);
  h.optimizer = static_cast<uint32_t>(optimizer);
  h.save_mode = static_cast<uint32_t>(save_mode);
  h.server = static_cast<uint32_t>(server);
  h.num_servers = static_cast<uint32_t>(num_servers);
  h.state = static_cast<uint32_t>(state);
  h.dim = dim;
  return h;
}

PartHeader PartHeader::decode(const char* in, const std::string& path) {
  if (std::memcmp(in, "DTPSPART", 8) != 0) fail_file(path, "not a dtrain ps part file (bad magic)");
  if (get32(in + 8) != 1) fail_file(path, "format version " + std::to_string(get32(in + 8)) + ", this build reads 1");
  PartHeader h;
  h.kind = get32(in + 12);
  h.optimizer = get32(in + 16);
  h.save_mode = get32(in + 20);
  h.server = get32(in + 24);
  h.num_servers = get32(in + 28);
  h.state = get32(in + 32);
  h.dim = get64(in + 40);
  h.count = get64(in + 48);
  h.dense_begin = get64(in + 56);
  h.table_t = get64(in + 64);
  return h;
}

PartHeader read_part_header(FileReader& r, const Manifest& m, uint32_t state, const std::string& state_what,
                            uint64_t item_bytes, const std::string& items) {
  const std::string& path = r.path();
  char hb[PartHeader::kBytes];
  if (r.size() < sizeof hb) fail_file(path, "truncated: " + std::to_string(r.size()) + " bytes, no header");
  r.read(hb, sizeof hb);
  const PartHeader h = PartHeader::decode(hb, path);
  auto mismatch = [&](const std::string& field, const std::string& here, const std::string& there) {
    sdk::fail(DT_ERR_INVALID_USAGE, path + ": " + field + " is " + here + ", expected " + there);
  };
  if (h.kind != static_cast<uint32_t>(m.kind))
    mismatch("kind", kind_name(h.kind), std::string(kind_name(m.kind)) + " (the MANIFEST's)");
  if (h.dim != m.dim) mismatch("dim", std::to_string(h.dim), std::to_string(m.dim) + " (the MANIFEST's)");
  if (h.save_mode != static_cast<uint32_t>(m.mode))
    mismatch("mode", save_mode_name(h.save_mode), std::string(save_mode_name(m.mode)) + " (the MANIFEST's)");
  if (h.optimizer != static_cast<uint32_t>(m.optimizer))
    mismatch("optimizer", optimizer_name(h.optimizer), std::string(optimizer_name(m.optimizer)) + " (the MANIFEST's)");
  if (h.state != state) mismatch("state", std::to_string(h.state), state_what);
  const uint64_t expect = sizeof hb + h.count * item_bytes + 8;
  if (r.size() != expect)
    fail_file(path, (r.size() < expect ? "truncated: " : "has trailing bytes: ") + std::to_string(r.size()) +
                        " bytes, expected " + std::to_string(expect) + " for " + std::to_string(h.count) + " " + items);
  return h;
}

std::string save_part_name(const std::string& table, const std::string& generation, int server, int num_servers,
                           int mode, int format) {
  if (mode < DT_PS_SAVE_FULL || mode > DT_PS_SAVE_DELTA || format < DT_PS_FORMAT_BINARY || format > DT_PS_FORMAT_TEXT)
    sdk::fail(DT_ERR_INVALID_USAGE, "table '" + table + "': unknown save mode " + std::to_string(mode) + " or format " +
                                        std::to_string(format));
  if (!safe_name(generation))
    sdk::fail(DT_ERR_INVALID_USAGE, "table '" + table + "': bad save generation '" + generation + "'");
  return part_file_name(generation, server, num_servers, format);
}

std::string part_file_name(const std::string& generation, int server, int num_servers, int format) {
  return "part-" + generation + "-" + std::to_string(server) + "-of-" + std::to_string(num_servers) +
         (format == DT_PS_FORMAT_TEXT ? ".txt" : ".bin");
}

bool parse_part_file_name(const std::string& name, int* server, int* num_servers) {
  // ...-<server>-of-<S>.ext, parsed from the end (the generation may hold '-').
  const size_t dot = name.rfind('.');
  const size_t of = name.rfind("-of-");
  if (dot == std::string::npos || of == std::string::npos || of > dot) return false;
  const size_t dash = name.rfind('-', of - 1);
  if (dash == std::string::npos) return false;
  uint64_t s = 0, n = 0;
  if (!parse_u64(std::string_view(name).substr(dash + 1, of - dash - 1), &s) ||
      !parse_u64(std::string_view(name).substr(of + 4, dot - of - 4), &n) || n == 0 || s >= n || n > 1000000)
    return false;
  *server = static_cast<int>(s);
  *num_servers = static_cast<int>(n);
  return true;
}

bool safe_name(const std::string& s) {
  if (s.empty() || s == "." || s == "..") return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-')) return false;
  return true;
}

void append_float(std::string& out, float v) {
  char b[32];
  auto r = std::to_chars(b, b + sizeof b, v);
  out.append(b, r.ptr);
}

void append_u64(std::string& out, uint64_t v) {
  char b[24];
  auto r = std::to_chars(b, b + sizeof b, v);
  out.append(b, r.ptr);
}

bool parse_float(std::string_view s, float* v) {
  auto r = std::from_chars(s.data(), s.data() + s.size(), *v);
  if (r.ec == std::errc() && r.ptr == s.data() + s.size()) return true;
  // from_chars refuses "inf"/"nan" spellings other than its own and a leading '+'.
  if (!s.empty() && s[0] == '+') return parse_float(s.substr(1), v);
  return false;
}

bool parse_u64(std::string_view s, uint64_t* v) {
  auto r = std::from_chars(s.data(), s.data() + s.size(), *v);
  return !s.empty() && r.ec == std::errc() && r.ptr == s.data() + s.size();
}

void split_fields(std::string_view line, std::vector<std::string_view>& out) {
  out.clear();
  size_t i = 0;
  const size_t n = line.size();
  while (i < n) {
    while (i < n && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    if (i == n) break;
    size_t j = i;
    while (j < n && line[j] != ' ' && line[j] != '\t' && line[j] != '\r') ++j;
    out.push_back(line.substr(i, j - i));
    i = j;
  }
}

namespace {

const char* const kKinds[] = {"dense", "sparse"};
const char* const kOptimizers[] = {"sgd", "adagrad", "adam"};
const char* const kModes[] = {"full", "base", "delta"};
const char* const kFormats[] = {"binary", "text"};

template <size_t N>
const char* name_of(const char* const (&names)[N], int v) {
  return v >= 0 && static_cast<size_t>(v) < N ? names[v] : "unknown";
}
template <size_t N>
int code_of(const char* const (&names)[N], const std::string& s) {
  for (size_t i = 0; i < N; ++i)
    if (s == names[i]) return static_cast<int>(i);
  return -1;
}

}  // namespace

const char* kind_name(int kind) { return name_of(kKinds, kind); }
const char* optimizer_name(int optimizer) { return name_of(kOptimizers, optimizer); }
const char* save_mode_name(int mode) { return name_of(kModes, mode); }
const char* format_name(int format) { return name_of(kFormats, format); }

void Manifest::write(const std::string& table_dir) const {
  std::string s = "# dtrain ps_grpc table save: written last; a directory without MANIFEST holds no complete save\n";
  auto kv = [&](const char* k, const std::string& v) { s += std::string(k) + " = " + v + "\n"; };
  kv("version", "1");
  kv("table", table);
  kv("kind", kind_name(kind));
  kv("dim", std::to_string(dim));
  kv("optimizer", optimizer_name(optimizer));
  kv("mode", save_mode_name(mode));
  kv("format", format_name(format));
  kv("num_servers", std::to_string(num_servers));
  kv("generation", generation);
  for (const auto& f : files) {
    if (!safe_name(f))
      sdk::fail(DT_ERR_INVALID_USAGE, "manifest of table '" + table + "': bad part file name '" + f + "'");
    kv("file", f);
  }
  {
    AtomicWriter w(table_dir, "MANIFEST");
    w.write(s);
    w.commit();
  }
  // The new save is durable: drop the parts of older or interrupted saves.
  if (DIR* d = ::opendir(table_dir.c_str())) {
    std::vector<std::string> stale;
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind("part-", 0) != 0) continue;
      bool listed = false;
      for (const auto& f : files) listed = listed || f == n;
      if (!listed) stale.push_back(n);
    }
    ::closedir(d);
    for (const auto& n : stale) ::unlink((table_dir + "/" + n).c_str());
  }
}

Manifest Manifest::read(const std::string& table_dir) {
  const std::string path = table_dir + "/MANIFEST";
  if (::access(path.c_str(), F_OK) != 0)
    sdk::fail(DT_ERR_SYSTEM, "no complete save in " + table_dir + ": " + path +
                                 " does not exist (a save writes it last; an interrupted save leaves none)");
  FileReader r(path);
  Manifest m;
  bool seen[10] = {};
  std::string_view line;
  while (r.getline(line)) {
    const std::string where = path + ":" + std::to_string(r.line());
    const std::string l = sdk::trim(line);
    if (l.empty() || l[0] == '#') continue;
    const size_t eq = l.find('=');
    if (eq == std::string::npos) sdk::fail(DT_ERR_SYSTEM, where + ": expected 'key = value', found '" + l + "'");
    const std::string k = sdk::trim(std::string_view(l).substr(0, eq));
    const std::string v = sdk::trim(std::string_view(l).substr(eq + 1));
    auto number = [&](uint64_t max) {
      uint64_t n = 0;
      if (!parse_u64(v, &n) || n > max)
        sdk::fail(DT_ERR_SYSTEM, where + ": " + k + " = '" + v + "' is not a valid number");
      return n;
    };
    auto code = [&](int c) {
      if (c < 0) sdk::fail(DT_ERR_SYSTEM, where + ": unknown " + k + " '" + v + "'");
      return c;
    };
    static const char* const keys[] = {"version", "table",  "kind",        "dim",       "optimizer",
                                       "mode",    "format", "num_servers", "generation"};
    int idx = -1;
    for (int i = 0; i < 9; ++i)
      if (k == keys[i]) idx = i;
    if (k == "file") {
      if (!safe_name(v)) sdk::fail(DT_ERR_SYSTEM, where + ": bad part file name '" + v + "'");
      m.files.push_back(v);
      continue;
    }
    if (idx < 0) sdk::fail(DT_ERR_SYSTEM, where + ": unknown key '" + k + "'");
    if (seen[idx]) sdk::fail(DT_ERR_SYSTEM, where + ": '" + k + "' given twice");
    seen[idx] = true;
    switch (idx) {
      case 0:
        if (v != "1") sdk::fail(DT_ERR_SYSTEM, where + ": manifest version " + v + ", this build reads 1");
        break;
      case 1: m.table = v; break;
      case 2: m.kind = code(code_of(kKinds, v)); break;
      case 3: m.dim = number(UINT64_MAX); break;
      case 4: m.optimizer = code(code_of(kOptimizers, v)); break;
      case 5: m.mode = code(code_of(kModes, v)); break;
      case 6: m.format = code(code_of(kFormats, v)); break;
      case 7: m.num_servers = static_cast<int>(number(1000000)); break;
      case 8: m.generation = v; break;
    }
  }
  static const char* const required[] = {"version", "table",  "kind",        "dim",       "optimizer",
                                         "mode",    "format", "num_servers", "generation"};
  for (int i = 0; i < 9; ++i)
    if (!seen[i]) sdk::fail(DT_ERR_SYSTEM, path + ": '" + required[i] + "' is missing");
  if (m.files.empty()) sdk::fail(DT_ERR_SYSTEM, path + ": lists no part file");
  return m;
}

}  // namespace dtrain::ps_grpc
