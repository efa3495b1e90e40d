#include "batchtune/common/size.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <utility>

#include "batchtune/common/error.h"

namespace batchtune {
namespace {

struct Unit {
  const char* name;
  double bytes;
};

// Longest names first so that "MiB" is not read as "M" + "iB".
constexpr Unit kUnits[] = {
    {"kib", 1024.0},           {"mib", 1024.0 * 1024},
    {"gib", 1024.0 * 1024 * 1024}, {"tib", 1024.0 * 1024 * 1024 * 1024},
    {"kb", 1e3},               {"mb", 1e6},
    {"gb", 1e9},               {"tb", 1e12},
    {"k", 1024.0},             {"m", 1024.0 * 1024},
    {"g", 1024.0 * 1024 * 1024}, {"t", 1024.0 * 1024 * 1024 * 1024},
    {"b", 1.0},                {"", 1.0},
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

int64_t parse_size(const std::string& text, const std::string& what) {
  const auto fail = [&](const std::string& why) {
    return Error(fmt::format(
        "{}: cannot read '{}' as a size ({}); write a byte count or a number "
        "with a unit, like 512MiB, 2GiB or 1.5GB",
        what, text, why));
  };
  size_t pos = 0;
  while (pos < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.')) {
    ++pos;
  }
  const std::string number = text.substr(0, pos);
  if (number.empty() || std::count(number.begin(), number.end(), '.') > 1 ||
      number == ".") {
    throw fail("no number");
  }
  std::string unit = text.substr(pos);
  if (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  unit = lower(unit);
  const Unit* match = nullptr;
  for (const Unit& u : kUnits) {
    if (unit == u.name) {
      match = &u;
      break;
    }
  }
  if (match == nullptr) throw fail(fmt::format("unknown unit '{}'", unit));
  const double bytes = std::stod(number) * match->bytes;
  if (!std::isfinite(bytes) ||
      bytes >= static_cast<double>(std::numeric_limits<int64_t>::max())) {
    throw fail("too large");
  }
  const auto rounded = static_cast<int64_t>(std::llround(bytes));
  if (rounded <= 0) throw fail("must be more than zero bytes");
  return rounded;
}

std::string format_bytes(int64_t bytes) {
  constexpr std::pair<const char*, double> kSteps[] = {
      {"TiB", 1024.0 * 1024 * 1024 * 1024},
      {"GiB", 1024.0 * 1024 * 1024},
      {"MiB", 1024.0 * 1024},
      {"KiB", 1024.0}};
  const double value = static_cast<double>(bytes);
  for (const auto& [name, size] : kSteps) {
    if (std::abs(value) >= size) {
      const double scaled = value / size;
      return fmt::format(std::abs(scaled) < 10 ? "{:.2f} {}" : "{:.1f} {}",
                         scaled, name);
    }
  }
  return fmt::format("{} B", bytes);
}

}  // namespace batchtune
