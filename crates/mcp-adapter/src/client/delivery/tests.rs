//! The delivery tests: a call waits for the notifications read before it, in order, and an id is
//! kept only while its request is open.

use rmcp::transport::async_rw::AsyncRwTransport;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::*;

fn message(v: Value) -> TxJsonRpcMessage<RoleClient> {
    serde_json::from_value(v).expect("a client message")
}

/// A notification is open while any copy of it is held; a call waits for the open ones
/// to be handled, and no longer than its bound when one is never handled.
#[tokio::test(start_paused = true)]
async fn a_call_waits_for_the_notifications_read_before_it() {
    let deliveries = Deliveries::default();
    let note = deliveries.start();
    let copy = note.clone();
    let second = deliveries.start();
    assert_eq!(deliveries.open(), 2);
    drop(copy);
    assert_eq!(deliveries.open(), 2, "a copy is the same notification");
    drop(second);
    let handler = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        drop(note);
    });
    let started = tokio::time::Instant::now();
    let ms = std::time::Duration::from_millis;
    assert_eq!(deliveries.settled(ms(10_000), ms(10_000)).await, None);
    assert_eq!(deliveries.open(), 0);
    assert!(started.elapsed() >= ms(50));
    handler.await.unwrap();
    // One never handled (a stuck client): the wait ends once none moved on for the
    // stall, and says how many were left.
    let _stuck = deliveries.start();
    let started = tokio::time::Instant::now();
    assert_eq!(deliveries.settled(ms(30), ms(10_000)).await, Some(1));
    assert_eq!(started.elapsed(), ms(30));
    assert_eq!(deliveries.open(), 1);
}

/// A flood handed on steadily is waited for past the stall bound, as long as one of
/// them moves on within each stall, and up to the bound on the whole wait (a bound on the
/// whole wait alone would lose the tail of a long flood).
#[tokio::test(start_paused = true)]
async fn a_call_waits_for_a_flood_that_moves_on() {
    let ms = std::time::Duration::from_millis;
    let deliveries = Deliveries::default();
    let tickets: Vec<Delivering> = (0..100).map(|_| deliveries.start()).collect();
    // One handled every 10 ms: 1 s in all, five times the 200 ms stall.
    let handler = tokio::spawn(async move {
        for ticket in tickets {
            tokio::time::sleep(ms(10)).await;
            drop(ticket);
        }
    });
    let started = tokio::time::Instant::now();
    assert_eq!(deliveries.settled(ms(200), ms(10_000)).await, None);
    assert_eq!(deliveries.open(), 0);
    assert_eq!(started.elapsed(), ms(1000));
    handler.await.unwrap();
    // The same flood against a bound of 300 ms on the whole wait: it gives up there,
    // and says how many were left (70 of 100, at 10 ms each).
    let tickets: Vec<Delivering> = (0..100).map(|_| deliveries.start()).collect();
    let handler = tokio::spawn(async move {
        for ticket in tickets {
            tokio::time::sleep(ms(10)).await;
            drop(ticket);
        }
    });
    let started = tokio::time::Instant::now();
    let left = deliveries.settled(ms(200), ms(300)).await;
    assert_eq!(started.elapsed(), ms(300));
    assert!(matches!(left, Some(70 | 71)), "left {left:?}");
    handler.await.unwrap();
    // Tickets issued after the wait began are not its to wait for: one read before
    // it, handled at 50 ms, and one read at 5 ms that is never handled.
    let before = deliveries.start();
    let later = tokio::spawn({
        let deliveries = deliveries.clone();
        async move {
            tokio::time::sleep(ms(5)).await;
            let stuck = deliveries.start();
            tokio::time::sleep(ms(45)).await;
            drop(before);
            tokio::time::sleep(ms(60_000)).await;
            drop(stuck);
        }
    });
    let started = tokio::time::Instant::now();
    assert_eq!(deliveries.settled(ms(200), ms(10_000)).await, None);
    assert_eq!(started.elapsed(), ms(50));
    later.abort();
}

/// Handlers run in the order their notifications were read, whatever order their tasks
/// start in (rmcp spawns one per notification: a burst of progress went backwards); one
/// that is never done holds the next one for [`TURN_WAIT`] at most.
#[tokio::test(start_paused = true)]
async fn notifications_are_handled_in_the_order_they_were_read() {
    let deliveries = Deliveries::default();
    let tickets: Vec<Delivering> = (0..4).map(|_| deliveries.start()).collect();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, ticket) in tickets.into_iter().enumerate().rev() {
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            ticket.turn().await;
            order.lock().unwrap().push(i);
            drop(ticket);
        }));
        tokio::task::yield_now().await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3]);
    // A ticket held forever: the next one's turn comes after the bound.
    let stuck = deliveries.start();
    let next = deliveries.start();
    let started = tokio::time::Instant::now();
    next.turn().await;
    assert!(started.elapsed() >= TURN_WAIT);
    drop((stuck, next));
    // A handler whose delivery never ends (a client that does not read) holds the next
    // one for the bound only, and its own delivery goes on in its task.
    let (first, second) = (deliveries.start(), deliveries.start());
    let started = tokio::time::Instant::now();
    in_turn(Some(first), std::future::pending()).await;
    let held = started.elapsed();
    assert!(held >= TURN_WAIT, "{held:?}");
    let ran = Arc::new(Mutex::new(false));
    let flag = ran.clone();
    in_turn(Some(second), async move { *flag.lock().unwrap() = true }).await;
    assert!(*ran.lock().unwrap());
    assert_eq!(started.elapsed(), held, "its turn had come");
    assert_eq!(deliveries.open(), 0);
}

/// Every request's id is forgotten when the request ends, whatever it was and however it
/// ended; only an open, written request's id is kept.
#[tokio::test]
async fn an_id_is_kept_only_while_its_request_is_open() {
    let (ours, theirs) = tokio::io::duplex(1 << 16);
    let (read, write) = tokio::io::split(ours);
    let written = Written::default();
    let mut transport = Tracked {
        inner: AsyncRwTransport::new_client(read, write),
        written: written.clone(),
        marks_itself: false,
        answers: Default::default(),
        deliveries: Default::default(),
    };
    let (server_read, mut server_write) = tokio::io::split(theirs);
    let mut server = BufReader::new(server_read).lines();
    let request = |id: i64, method: &str| {
        message(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {}}))
    };
    let mut answer = async |line: Value| {
        let text = format!("{line}\n");
        server_write.write_all(text.as_bytes()).await.unwrap();
    };

    // A ping answered with a result, a list answered with an error.
    for (id, method) in [(1, "ping"), (2, "tools/list")] {
        transport.send(request(id, method)).await.unwrap();
        server.next_line().await.unwrap().expect("the request");
        assert_eq!(written.len(), 1);
        answer(if id == 1 {
            json!({"jsonrpc": "2.0", "id": id, "result": {}})
        } else {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": "no"}})
        })
        .await;
        transport.receive().await.expect("the answer");
        assert_eq!(written.len(), 0, "request {id} is still kept");
    }

    // A call we cancel: the server will not answer it.
    transport.send(request(3, "tools/call")).await.unwrap();
    assert_eq!(written.len(), 1);
    transport
        .send(message(
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                             "params": {"requestId": 3, "reason": "timed out"}}),
        ))
        .await
        .unwrap();
    assert_eq!(written.len(), 0);

    // An open request is kept and known to be written.
    transport.send(request(4, "tools/call")).await.unwrap();
    assert!(written.take(&RequestId::Number(4)));
    assert!(!written.take(&RequestId::Number(4)));

    // An answer whose id is a string naming the request's number answers it, as rmcp
    // reads it; one to an id never sent is noted as stray.
    let since = std::time::Instant::now();
    transport.send(request(9, "tools/call")).await.unwrap();
    server.next_line().await.unwrap().expect("the request");
    answer(json!({"jsonrpc": "2.0", "id": "9", "result": {}})).await;
    transport.receive().await.expect("the answer");
    assert_eq!(written.len(), 0, "request 9 is still kept");
    assert_eq!(written.stray_since(since), None);
    answer(json!({"jsonrpc": "2.0", "id": 12345, "result": {}})).await;
    transport.receive().await.expect("the stray answer");
    assert_eq!(written.stray_since(since), Some(RequestId::Number(12345)));

    // A write that finished at once is recorded before its future is awaited (rmcp
    // awaits it in a task of its own, which may run after the server has answered).
    let pending = transport.send(request(5, "tools/call"));
    assert!(written.ids().written.contains(&RequestId::Number(5)));
    pending.await.unwrap();
    assert!(written.take(&RequestId::Number(5)));
    // A write under way whose completion was not seen may have reached the server: it
    // is not taken for unsent (a call whose server died running it was sent again).
    written.sending(RequestId::Number(6));
    assert!(written.take(&RequestId::Number(6)));
    // One never handed to the pipe, or whose write failed, is unsent.
    assert!(!written.take(&RequestId::Number(7)));
    written.sending(RequestId::Number(8));
    written.sent(&RequestId::Number(8), false);
    assert!(!written.take(&RequestId::Number(8)));
}
