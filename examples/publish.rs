//! Load generator for benchmarks: publishes each line of standard input as one QoS 1 message
//! and exits once the broker has acknowledged every one (mosquitto_pub -l can drop lines at
//! high rates). Usage: `cargo run --release --example publish -- PORT TOPIC CLIENT_ID [RATE] <
//! lines`; with RATE, at most RATE messages per second, evenly paced (a steady feed).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::BufRead;

use rumqttc::{AsyncClient, Event, Incoming, MqttOptions, QoS};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (port, topic, id) = (
        args[1].parse::<u16>().expect("PORT"),
        args[2].clone(),
        args[3].clone(),
    );
    let rate: Option<u64> = args.get(4).map(|r| r.parse().expect("RATE"));
    let lines: Vec<Vec<u8>> = std::io::stdin()
        .lock()
        .split(b'\n')
        .map(|l| l.unwrap())
        .filter(|l| !l.is_empty())
        .collect();
    let mut opts = MqttOptions::new(id, "127.0.0.1", port);
    opts.set_inflight(200).set_max_packet_size(1 << 20, 1 << 20);
    let (client, mut eventloop) = AsyncClient::new(opts, 1000);
    let total = lines.len();
    tokio::spawn(async move {
        let mut tick = rate.map(|r| {
            let mut i = tokio::time::interval(std::time::Duration::from_nanos(1_000_000_000 / r));
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            i
        });
        for l in lines {
            if let Some(t) = tick.as_mut() {
                t.tick().await;
            }
            client
                .publish(topic.clone(), QoS::AtLeastOnce, false, l)
                .await
                .unwrap();
        }
    });
    let mut acked = 0;
    while acked < total {
        match eventloop.poll().await {
            Ok(Event::Incoming(Incoming::PubAck(_))) => acked += 1,
            Ok(_) => {}
            Err(e) => panic!("publisher connection failed after {acked} acks: {e}"),
        }
    }
}
