//! Paginated listings: the one loop behind every `Marker` / `NextToken`
//! read. Each page is still one call through the door, so it is throttled,
//! retried and counted like any other; only the page-to-page walk is here.

use std::future::Future;

/// Reads a listing to its last page. `read(token)` sends one call with the
/// previous page's token (`None` for the first) and returns what it keeps
/// of that page and the page's next token; an absent or empty token ends
/// the listing (AWS answers both). The first failing page fails the read.
pub(crate) async fn every_page<C, T, I, E, F, Fut>(mut read: F) -> Result<C, E>
where
    C: Default + Extend<T>,
    I: IntoIterator<Item = T>,
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Result<(I, Option<String>), E>>,
{
    let mut all = C::default();
    let mut token = None;
    loop {
        let (items, next) = read(token.take()).await?;
        all.extend(items);
        match next.filter(|t| !t.is_empty()) {
            Some(next) => token = Some(next),
            None => return Ok(all),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listing of `pages`, ending with `last` as its final token.
    async fn walk(pages: &[&[u32]], last: Option<&str>) -> (Vec<u32>, Vec<Option<String>>) {
        let mut asked = Vec::new();
        let all = every_page(|token: Option<String>| {
            asked.push(token.clone());
            let at: usize = token.map_or(0, |t| t.parse().unwrap());
            let next = if at + 1 < pages.len() {
                Some((at + 1).to_string())
            } else {
                last.map(str::to_string)
            };
            let page = pages[at].to_vec();
            async move { Ok::<_, ()>((page, next)) }
        })
        .await
        .unwrap();
        (all, asked)
    }

    #[tokio::test]
    async fn every_page_is_read_in_order_each_with_the_previous_token() {
        let (all, asked) = walk(&[&[1, 2], &[3], &[4, 5]], None).await;
        assert_eq!(all, vec![1, 2, 3, 4, 5]);
        assert_eq!(asked, vec![None, Some("1".into()), Some("2".into())]);
        // An empty token ends the listing as an absent one does.
        let (all, asked) = walk(&[&[7]], Some("")).await;
        assert_eq!((all, asked.len()), (vec![7], 1));
    }

    #[tokio::test]
    async fn a_failing_page_fails_the_read_and_reads_no_further() {
        let mut calls = 0;
        let read: Result<Vec<u32>, &str> = every_page(|token: Option<String>| {
            calls += 1;
            async move {
                match token {
                    None => Ok((vec![1], Some("next".to_string()))),
                    Some(_) => Err("throttled"),
                }
            }
        })
        .await;
        assert_eq!(read, Err("throttled"));
        assert_eq!(calls, 2);
    }
}
