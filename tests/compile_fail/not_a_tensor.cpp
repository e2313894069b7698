#include <gradsync/gradsync.hpp>
int main() { gradsync::GradientSync<gradsync::SelfBackend, double> s(gradsync::SelfBackend{}); }
