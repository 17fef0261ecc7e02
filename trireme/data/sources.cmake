# data/: tokenizer (header only), corpus and sampler (pure), batch (torch); the bundled
# corpus is installed to <prefix>/share/trireme/corpus.
target_sources(trireme_core PRIVATE
  trireme/data/corpus.cpp
  trireme/data/sampler.cpp)
target_compile_definitions(trireme_core PRIVATE TRIREME_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
target_sources(trireme PRIVATE
  trireme/data/batch.cpp)
install(FILES
  ${PROJECT_SOURCE_DIR}/assets/corpus/kjv.txt
  ${PROJECT_SOURCE_DIR}/assets/corpus/SOURCE.md
  DESTINATION ${CMAKE_INSTALL_DATADIR}/trireme/corpus)
