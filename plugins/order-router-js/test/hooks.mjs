// Node module hooks: `acemq:plugin/host@0.4.0` resolves to fake-host.mjs.
export async function resolve(specifier, context, next) {
  if (specifier.startsWith('acemq:plugin/host@')) {
    return { url: new URL('./fake-host.mjs', import.meta.url).href, shortCircuit: true };
  }
  return next(specifier, context);
}
