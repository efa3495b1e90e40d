#pragma once

#include <string>

namespace batchtune {

/// A shared library opened with `dlopen` for as long as this object lives.
/// Errors name the library and, for symbols, the symbol.
///
/// Example:
/// ```
///   SharedLibrary nvml("libnvidia-ml.so.1");
///   auto init = nvml.symbol<int (*)()>("nvmlInit_v2");
/// ```
class SharedLibrary {
 public:
  /// Opens `name`; throws `std::runtime_error` naming it when that fails.
  explicit SharedLibrary(const std::string& name);
  ~SharedLibrary();
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;

  /// Whether `name` can be opened here; when not, `reason` gets why.
  static bool can_open(const std::string& name, std::string* reason);

  template <typename Fn>
  Fn symbol(const std::string& name) const {
    return reinterpret_cast<Fn>(raw_symbol(name));
  }
  /// The symbol, or nullptr where this version of the library lacks it.
  template <typename Fn>
  Fn optional_symbol(const std::string& name) const {
    return reinterpret_cast<Fn>(raw_symbol(name, /*required=*/false));
  }

 private:
  void* raw_symbol(const std::string& name, bool required = true) const;

  std::string name_;
  void* handle_ = nullptr;
};

}  // namespace batchtune
