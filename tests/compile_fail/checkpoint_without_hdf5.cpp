// gradsync/checkpoint.hpp in a program that does not link GradSync::hdf5: refused with the reason.
#include <gradsync/checkpoint.hpp>
int main() {}
