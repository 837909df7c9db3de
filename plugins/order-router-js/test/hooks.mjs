// Node module hooks: `acemq:plugin/host@0.4.0` and `acemq:plugin/state@0.4.0`
// resolve to fake-host.mjs.
export async function resolve(specifier, context, next) {
  if (specifier.startsWith('acemq:plugin/host@') || specifier.startsWith('acemq:plugin/state@')) {
    return { url: new URL('./fake-host.mjs', import.meta.url).href, shortCircuit: true };
  }
  return next(specifier, context);
}
