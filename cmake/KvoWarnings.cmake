# Warning and floating-point flags for project code (never for third-party code).
#
# -ffp-contract=off: SPEC principle 2. The compiler must not fuse a*b+c into an fma that the spec does
# not name, or the CPU model stops being bit-exact. It is applied to every project target, not only
# reference/, because the oracle and tests compute expected values too.
function(kvo_project_target target)
  target_compile_features(${target} PUBLIC cxx_std_20)
  # -Wno-restrict: GCC 12 reports a false -Wrestrict inside std::string's operator+ at -O3
  # (GCC bug 105329); the warning is not about project code.
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -ffp-contract=off -fno-fast-math>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-restrict>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${KVO_WERROR}>>:-Werror>)
endfunction()
