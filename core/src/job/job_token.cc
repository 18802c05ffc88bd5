#include "dtrain/job_token.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "dtrain/error.h"

namespace dtrain {

std::string make_job_token() {
  uint8_t raw[16];
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(std::string("cannot open /dev/urandom for the job token: ") + std::strerror(errno));
  size_t off = 0;
  while (off < sizeof raw) {
    ssize_t n = ::read(fd, raw + off, sizeof raw - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      ::close(fd);
      throw IoError(std::string("cannot read /dev/urandom for the job token: ") + std::strerror(err));
    }
    off += static_cast<size_t>(n);
  }
  ::close(fd);
  static const char* hex = "0123456789abcdef";
  std::string token;
  for (uint8_t b : raw) {
    token += hex[b >> 4];
    token += hex[b & 15];
  }
  return token;
}

}  // namespace dtrain
