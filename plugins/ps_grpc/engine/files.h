#pragma once
// File plumbing of the table engine: atomic part files (temporary name,
// fsync, rename, fsync of the directory), a buffered reader with line numbers,
// the binary part header, the part file names and the text number format.
// The formats themselves are documented in files.cc.

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::ps_grpc {

// DT_ERR_SYSTEM "<what> <path>: <strerror(errno)>".
[[noreturn]] void fail_io(const std::string& what, const std::string& path);
// DT_ERR_SYSTEM "<path>: <what>" (a malformed file).
[[noreturn]] void fail_file(const std::string& path, const std::string& what);
void fsync_dir(const std::string& dir);

// Writes dir/name as dir/name.tmp, then commit() flushes, fsyncs, renames to
// dir/name and fsyncs dir. Destroyed without commit: the temporary is removed.
class AtomicWriter {
 public:
  AtomicWriter(const std::string& dir, const std::string& name);
  ~AtomicWriter();
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;

  void write(const void* p, size_t n) {
    if (used_ + n > buf_.size())
      flush_some(p, n);
    else {
      std::memcpy(buf_.data() + used_, p, n);
      used_ += n;
    }
  }
  void write(std::string_view s) { write(s.data(), s.size()); }
  // Overwrites bytes already written (e.g. a header whose counts are known last).
  void overwrite(uint64_t offset, const void* p, size_t n);
  void commit();
  const std::string& path() const { return final_; }

 private:
  void flush_some(const void* p, size_t n);
  void flush();

  std::string dir_, tmp_, final_;
  int fd_ = -1;
  std::vector<char> buf_;
  size_t used_ = 0;
  bool committed_ = false;
};

class FileReader {
 public:
  explicit FileReader(const std::string& path);  // DT_ERR_SYSTEM naming path if it cannot be opened
  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Exactly n bytes, else DT_ERR_SYSTEM "<path>: truncated: ...".
  void read(void* p, size_t n);
  // The next line without its '\n'; false at the end. line() is its 1-based number.
  bool getline(std::string_view& out);
  uint64_t line() const { return line_; }

 private:
  bool fill();

  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0, consumed_ = 0, line_ = 0;
  std::vector<char> buf_;
  size_t begin_ = 0, end_ = 0;
  std::string carry_;
};

// The fixed 96-byte header of a binary part file (layout in files.cc).
struct PartHeader {
  static constexpr size_t kBytes = 96;
  uint32_t kind = 0, optimizer = 0, save_mode = 0, server = 0, num_servers = 0;
  uint32_t state = 0;  // sparse: state floats per row; dense: state arrays
  uint64_t dim = 0;    // sparse: values per row; dense: the table's dim
  uint64_t count = 0;  // sparse: rows; dense: values in this part
  uint64_t dense_begin = 0;
  uint64_t table_t = 0;  // dense adam: the table's step count
  // A server's part of a table's save, with count, dense_begin and table_t 0.
  static PartHeader of(int kind, int optimizer, int save_mode, int server, int num_servers, uint64_t state,
                       uint64_t dim);
  void encode(char* out) const;
  static PartHeader decode(const char* in, const std::string& path);
};
constexpr char kPartEndMagic[8] = {'D', 'T', 'P', 'S', 'E', 'N', 'D', '1'};

// The part file a server saves `table` to, after checking the save's mode,
// format and generation (invalid usage naming the table).
std::string save_part_name(const std::string& table, const std::string& generation, int server, int num_servers,
                           int mode, int format);
// part-<generation>-<server>-of-<num_servers>.bin|.txt
std::string part_file_name(const std::string& generation, int server, int num_servers, int format);
bool parse_part_file_name(const std::string& name, int* server, int* num_servers);
// [A-Za-z0-9_.-]+, not "." or ".."
bool safe_name(const std::string& s);

// Text numbers: shortest round-trip form (std::to_chars), so text saves are exact.
void append_float(std::string& out, float v);
void append_u64(std::string& out, uint64_t v);
bool parse_float(std::string_view s, float* v);
bool parse_u64(std::string_view s, uint64_t* v);
// Splits a line on blanks into views (reusing out's storage).
void split_fields(std::string_view line, std::vector<std::string_view>& out);

// The manifest: written last, atomically, by the client that asked for the
// save (after every server reported its files). load() reads it; a directory
// without one holds no loadable save.
struct Manifest {
  std::string table;
  int kind = 0;
  uint64_t dim = 0;
  int optimizer = 0;
  int mode = 0;    // DT_PS_SAVE_*
  int format = 0;  // DT_PS_FORMAT_*
  int num_servers = 0;
  std::string generation;
  std::vector<std::string> files;
  void write(const std::string& table_dir) const;      // MANIFEST.tmp, fsync, rename to MANIFEST, fsync the dir
  static Manifest read(const std::string& table_dir);  // names the path and the bad line
};

// A binary part's header, read from r and checked: kind, dim, save mode and
// optimizer against the MANIFEST, state (PartHeader::state) against `state`
// (`state_what` says what that stands for), and the file's size against
// count items of `item_bytes` between the header and the end marker (`items`
// names them). Errors name the file and both values.
PartHeader read_part_header(FileReader& r, const Manifest& m, uint32_t state, const std::string& state_what,
                            uint64_t item_bytes, const std::string& items);

const char* kind_name(int kind);
const char* optimizer_name(int optimizer);
const char* save_mode_name(int mode);
const char* format_name(int format);

}  // namespace dtrain::ps_grpc
