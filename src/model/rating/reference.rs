//! The worked examples of issue 36, to the pico-USD.
