// cmake/FindTorchFromPython.cmake on a made-up machine: a fake torch wheel
// and a fake system LibTorch (Debian's libtorch-dev) side by side. The
// wheel's TorchConfig.cmake finds its libraries with find_library(... PATHS),
// which CMake searches after the system folders; the module must put the
// wheel first and say which LibTorch it found.

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace {

// Paths as strings, folders made by mkdir -p: libtorch.so exports its own
// std::filesystem, which crashes in this binary (see checkpoint_test.cpp).
void write(const std::string& path, const std::string& text) {
  const std::string folder = path.substr(0, path.rfind('/'));
  if (std::system(("mkdir -p '" + folder + "'").c_str()) != 0) ADD_FAILURE() << folder;
  std::ofstream(path) << text;
}

std::string real(const std::string& path) {
  char resolved[PATH_MAX];
  return ::realpath(path.c_str(), resolved) != nullptr ? resolved : path;
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class CmakeTorch : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/batchtune_cmake_torch_XXXXXX";
    ASSERT_NE(::mkdtemp(dir_template), nullptr);
    root_ = dir_template;
    wheel_ = root_ + "/site-packages/torch";
    write(wheel_ + "/lib/libtorch.so", "");
    write(wheel_ + "/share/cmake/Torch/TorchConfig.cmake",
          "get_filename_component(TORCH_INSTALL_PREFIX \"${CMAKE_CURRENT_LIST_DIR}/../../../\" "
          "ABSOLUTE)\n"
          "find_library(TORCH_LIBRARY torch PATHS \"${TORCH_INSTALL_PREFIX}/lib\")\n"
          "set(Torch_VERSION 2.11.0)\nset(Torch_FOUND TRUE)\n");
    write(root_ + "/system/lib/libtorch.so", "");  // Debian's 1.13
    write(root_ + "/python", "#!/bin/sh\nprintf %s '" + wheel_ + "/share/cmake'\n");
    ::chmod((root_ + "/python").c_str(), 0755);
  }
  void TearDown() override {
    if (std::system(("rm -rf '" + root_ + "'").c_str()) != 0) ADD_FAILURE() << root_;
  }

  /// Configures a project that includes the module as batchtune's
  /// CMakeLists.txt does, with the fake system folder as CMake's system
  /// prefix; returns the exit status, output in output_.
  int configure(const std::string& extra_args = "") {
    write(root_ + "/project/CMakeLists.txt",
          "cmake_minimum_required(VERSION 3.18)\nproject(probe NONE)\n"
          "set(CMAKE_FIND_LIBRARY_PREFIXES lib)\nset(CMAKE_FIND_LIBRARY_SUFFIXES .so)\n"
          "set(CMAKE_SYSTEM_PREFIX_PATH \"" + root_ + "/system\")\n"
          "set(CMAKE_FIND_USE_SYSTEM_ENVIRONMENT_PATH OFF)\n"
          "set(BATCHTUNE_PYTHON \"" + root_ + "/python\")\n"
          "include(\"" BATCHTUNE_SOURCE_DIR "/cmake/FindTorchFromPython.cmake\")\n"
          "find_package(Torch REQUIRED)\n"
          "if(COMMAND batchtune_report_torch)\n  batchtune_report_torch()\nendif()\n");
    const std::string command = "env -u CMAKE_PREFIX_PATH '" BATCHTUNE_CMAKE_COMMAND "' -S '" +
                                root_ + "/project' -B '" + root_ + "/build' " + extra_args +
                                " > '" + root_ + "/out.txt' 2>&1";
    const int status = std::system(command.c_str());
    // CMake wraps its error messages: words as a reader sees them.
    std::istringstream words(read(root_ + "/out.txt"));
    output_.clear();
    for (std::string word; words >> word;) output_ += word + " ";
    return status;
  }

  std::string cached(const std::string& name) {
    const std::string cache = read(root_ + "/build/CMakeCache.txt");
    const std::string key = "\n" + name + ":";
    const auto at = cache.find(key);
    if (at == std::string::npos) return "";
    const auto value = cache.find('=', at) + 1;
    return cache.substr(value, cache.find('\n', value) - value);
  }

  std::string root_, wheel_;
  std::string output_;
};

TEST_F(CmakeTorch, TheWheelsLibrariesComeBeforeASystemLibTorchAndTheOneFoundIsNamed) {
  ASSERT_EQ(configure(), 0) << output_;
  EXPECT_EQ(cached("TORCH_LIBRARY"), wheel_ + "/lib/libtorch.so") << output_;
  EXPECT_NE(output_.find("found LibTorch 2.11.0 in " + real(wheel_)),
            std::string::npos)
      << output_;
}

TEST_F(CmakeTorch, AnExplicitTorchDirAlsoComesBeforeTheSystem) {
  ASSERT_EQ(configure("-DTorch_DIR='" + wheel_ + "/share/cmake/Torch'"), 0) << output_;
  EXPECT_EQ(cached("TORCH_LIBRARY"), wheel_ + "/lib/libtorch.so") << output_;
}

TEST_F(CmakeTorch, AConfigThatFindsAnotherLibTorchsLibraryStopsNamingBoth) {
  std::remove((wheel_ + "/lib/libtorch.so").c_str());  // only the system's is left
  EXPECT_NE(configure(), 0) << output_;
  EXPECT_NE(output_.find(root_ + "/system/lib/libtorch.so"), std::string::npos)
      << output_;
  EXPECT_NE(output_.find("found " + real(root_) + "/system/lib/libtorch.so, a library of another "
                         "LibTorch; put " + real(wheel_) + " first on CMAKE_PREFIX_PATH"),
            std::string::npos)
      << output_;
}

}  // namespace
