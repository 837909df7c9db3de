//! Codec plugins (the `codec-plugin` world).
