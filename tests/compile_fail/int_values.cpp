#include <gradsync/gradsync.hpp>
int main() { gradsync::GradientSync<gradsync::SelfBackend, Kokkos::View<int*>> s(gradsync::SelfBackend{}); }
