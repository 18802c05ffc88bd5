#pragma once

#include <spdlog/spdlog.h>

namespace dtrain::detail {
spdlog::logger& logger();
}
