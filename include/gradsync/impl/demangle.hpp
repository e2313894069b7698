// gradsync internals: readable type names for error messages.
#pragma once

#include <string>
#include <typeinfo>
#if defined(__GNUG__)
#include <cxxabi.h>
#include <cstdlib>
#endif

namespace gradsync::impl {

template <class T>
std::string type_name() {
  const char* raw = typeid(T).name();
#if defined(__GNUG__)
  int status = 0;
  char* s = abi::__cxa_demangle(raw, nullptr, nullptr, &status);
  if (status == 0 && s) {
    std::string out(s);
    std::free(s);
    return out;
  }
#endif
  return raw;
}

}  // namespace gradsync::impl
