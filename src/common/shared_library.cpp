#include "common/shared_library.h"

#include <dlfcn.h>

#include <stdexcept>

namespace batchtune {
namespace {

std::string last_error() {
  const char* error = dlerror();
  return error != nullptr ? error : "unknown dlopen error";
}

}  // namespace

SharedLibrary::SharedLibrary(const std::string& name) : name_(name) {
  handle_ = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    throw std::runtime_error(name + " could not be loaded: " + last_error());
  }
}

SharedLibrary::~SharedLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

bool SharedLibrary::can_open(const std::string& name, std::string* reason) {
  try {
    SharedLibrary library(name);
    return true;
  } catch (const std::runtime_error& e) {
    if (reason != nullptr) *reason = e.what();
    return false;
  }
}

void* SharedLibrary::raw_symbol(const std::string& name, bool required) const {
  dlerror();
  void* symbol = dlsym(handle_, name.c_str());
  if (symbol == nullptr && required) {
    throw std::runtime_error(name_ + " has no symbol " + name + ": " + last_error());
  }
  return symbol;
}

}  // namespace batchtune
