// Nothing: the translation unit bs_test_pch compiles so that CMake builds the
// precompiled header every gtest suite reuses (tests/CMakeLists.txt, BLENDSERVE_PCH).
