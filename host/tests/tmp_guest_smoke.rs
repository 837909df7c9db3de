// THROWAWAY (guest-sdk engineer): loads the built plugins in wasmtime 48 and calls them.
use std::time::Instant;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, Store};

mod h {
    wasmtime::component::bindgen!({ path: "../wit", world: "handler-plugin" });
}
mod c {
    wasmtime::component::bindgen!({ path: "../wit", world: "codec-plugin" });
}
use h::acemq::plugin::{host, types};

#[derive(Default)]
struct St { logs: Vec<(host::Level, String)>, published: Vec<types::Outgoing> }
impl types::Host for St {}
impl host::Host for St {
    fn log(&mut self, level: host::Level, text: String) { self.logs.push((level, text)); }
    fn publish(&mut self, msg: types::Outgoing) -> Result<(), String> {
        if msg.exchange == "forbidden" { return Err("not allowed".into()); }
        self.published.push(msg); Ok(())
    }
    fn config(&mut self, key: String) -> Option<String> { (key == "events_exchange").then(|| "shop.events".to_string()) }
    fn now_ms(&mut self) -> u64 { 42 }
}

fn msg(body: &[u8]) -> types::Message {
    types::Message {
        envelope: types::Envelope { id: "m-1".into(), message_type: "order".into(), version: 1, correlation_id: "c".into(), causation_id: None, attempt: 1, first_seen_ms: 1, origin: None },
        delivery: types::Delivery { queue: "q".into(), exchange: "x".into(), routing_key: "rk".into(), redelivered: false, stream_offset: None },
        content_type: Some("application/json".into()),
        headers: vec![("tenant".into(), types::HeaderValue::Text("acme".into()))],
        body: body.to_vec(),
    }
}

fn load(engine: &Engine, path: &str) -> h::HandlerPluginPre<St> {
    let bytes = std::fs::read(path).unwrap();
    let t = Instant::now();
    let comp = Component::new(engine, &bytes).unwrap();
    eprintln!("{path}: {} bytes, compiled in {:?}", bytes.len(), t.elapsed());
    let mut linker: Linker<St> = Linker::new(engine);
    h::HandlerPlugin::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s).unwrap();
    h::HandlerPluginPre::new(linker.instantiate_pre(&comp).unwrap()).unwrap()
}

#[test]
fn smoke() {
    let mut cfg = Config::new();
    cfg.epoch_interruption(true);
    let engine = Engine::new(&cfg).unwrap();
    let root = env!("CARGO_MANIFEST_DIR").to_string() + "/../target/plugins/";

    let pre = load(&engine, &(root.clone() + "echo.wasm"));
    let mut store = Store::new(&engine, St::default());
    store.set_epoch_deadline(1000);
    let p = pre.instantiate(&mut store).unwrap();
    let m = msg(b"{}");
    assert!(matches!(p.acemq_plugin_handler().call_handle(&mut store, &m).unwrap(), types::Outcome::Accept));
    let n = 100_000;
    let t = Instant::now();
    for _ in 0..n { p.acemq_plugin_handler().call_handle(&mut store, &m).unwrap(); }
    eprintln!("echo: {:?}/call", t.elapsed() / n);

    let pre = load(&engine, &(root.clone() + "order-router.wasm"));
    let mut store = Store::new(&engine, St::default());
    store.set_epoch_deadline(1000);
    let p = pre.instantiate(&mut store).unwrap();
    let out = p.acemq_plugin_handler().call_handle(&mut store, &msg(br#"{"id":"o-1","customer":"acme","total":12.5,"x":[1]}"#)).unwrap();
    assert!(matches!(out, types::Outcome::Accept));
    let ev = store.data().published[0].clone();
    eprintln!("published: {} {} {:?} {}", ev.exchange, ev.routing_key, ev.content_type, String::from_utf8_lossy(&ev.body));
    assert_eq!(ev.exchange, "shop.events");
    assert_eq!(String::from_utf8(ev.body).unwrap(), r#"{"id":"o-1","customer":"acme","total":12.5,"routed_at_ms":42}"#);
    let out = p.acemq_plugin_handler().call_handle(&mut store, &msg(br#"{"id":"o-1","customer":"acme"}"#)).unwrap();
    eprintln!("missing: {out:?}");
    assert!(matches!(out, types::Outcome::Reject(ref r) if r.contains("missing field `total`")));
    let out = p.acemq_plugin_handler().call_handle(&mut store, &msg(br#"{"id":"o-9","customer":"acme","total":-1}"#)).unwrap();
    eprintln!("negative: {out:?}");
    eprintln!("logs: {:#?}", store.data().logs);
    assert_eq!(store.data().logs.len(), 3);
    let m = msg(br#"{"id":"o-1","customer":"acme","total":12.5}"#);
    let t = Instant::now();
    for _ in 0..10_000 { p.acemq_plugin_handler().call_handle(&mut store, &m).unwrap(); store.data_mut().published.clear(); store.data_mut().logs.clear(); }
    eprintln!("order-router accept: {:?}/call", t.elapsed() / 10_000);

    let pre = load(&engine, "/tmp/scratch-plugins/panicky.wasm");
    let mut store = Store::new(&engine, St::default());
    store.set_epoch_deadline(1000);
    let p = pre.instantiate(&mut store).unwrap();
    let err = p.acemq_plugin_handler().call_handle(&mut store, &msg(b"panic")).unwrap_err();
    eprintln!("panic trap: {:?} / logs {:?}", err.downcast_ref::<wasmtime::Trap>(), store.data().logs);
    eprintln!("full error: {err:?}");
    assert_eq!(err.downcast_ref::<wasmtime::Trap>(), Some(&wasmtime::Trap::UnreachableCodeReached));
    assert!(store.data().logs.last().unwrap().1.starts_with("panic: index out of bounds"));

    let bytes = std::fs::read("/tmp/scratch-plugins/shout.wasm").unwrap();
    let comp = Component::new(&engine, &bytes).unwrap();
    let linker: Linker<()> = Linker::new(&engine);
    let mut store = Store::new(&engine, ());
    store.set_epoch_deadline(1000);
    let cp = c::CodecPlugin::instantiate(&mut store, &comp, &linker).unwrap();
    let r = cp.acemq_plugin_codec().call_decode(&mut store, "text/x-shout", b"HELLO").unwrap();
    eprintln!("decode: {r:?}");
    assert_eq!(r, Ok(("text/plain".to_string(), b"hello".to_vec())));
    let r = cp.acemq_plugin_codec().call_decode(&mut store, "text/x-shout", &[0xff]).unwrap();
    eprintln!("decode bad: {r:?}");
    assert!(r.is_err());
}
