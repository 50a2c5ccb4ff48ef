// A plain TCP forwarder: the floor of one extra process hop on this machine.
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let listen = std::env::args().nth(1).unwrap();
    let to = std::env::args().nth(2).unwrap();
    let l = tokio::net::TcpListener::bind(&listen).await.unwrap();
    loop {
        let (mut a, _) = l.accept().await.unwrap();
        a.set_nodelay(true).unwrap();
        let to = to.clone();
        tokio::spawn(async move {
            let mut b = tokio::net::TcpStream::connect(&to).await.unwrap();
            b.set_nodelay(true).unwrap();
            let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
        });
    }
}
