//! A rules file's YAML as a tree of values that keep their places, with anchors, aliases and
//! `<<` merge keys resolved as the reference server's YAML library resolves them.
//!
//! Rules files repeat themselves (the same `rate_limit` under many keys), and their authors
//! factor the repetition out with `&anchor` / `*alias` and `<<: *defaults`. The tree is built
//! here, from the parser's events, so that a value reached through an alias still carries the
//! line of the text that wrote it: a mistake inside an anchor is named where it is written.

use std::collections::HashMap;

use hashlink::LinkedHashMap;
use marked_yaml::types::{MarkedMappingNode, MarkedScalarNode, MarkedSequenceNode};
use marked_yaml::{Marker, Node, Span};
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};

/// Why a text is not a YAML tree, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct YamlError {
    /// Where the parser stopped.
    pub mark: Option<Marker>,
    /// What it found.
    pub problem: String,
}

/// The key that merges mappings into the one holding it (YAML 1.1's merge key type).
const MERGE_KEY: &str = "<<";

/// The first document of `text` as a tree; an empty text is an empty mapping.
pub(super) fn parse(text: &str) -> Result<Node, YamlError> {
    let mut builder = Builder::default();
    Parser::new_from_str(text)
        .load(&mut builder, false)
        .map_err(|error| YamlError {
            mark: Some(marker(*error.marker())),
            problem: error.info().to_owned(),
        })?;
    if let Some(error) = builder.error {
        return Err(error);
    }
    Ok(builder
        .root
        .unwrap_or_else(|| Node::from(MarkedMappingNode::new_empty(Span::new_blank()))))
}

/// A collection whose end has not been read yet.
enum Open {
    Mapping {
        start: Marker,
        anchor: usize,
        /// Keys and values in the order written.
        entries: Vec<(MarkedScalarNode, Node)>,
        /// A key read, its value not yet.
        key: Option<MarkedScalarNode>,
    },
    Sequence {
        start: Marker,
        anchor: usize,
        items: Vec<Node>,
    },
}

#[derive(Default)]
struct Builder {
    open: Vec<Open>,
    /// Each anchor's node, by the parser's anchor id.
    anchors: HashMap<usize, Node>,
    root: Option<Node>,
    error: Option<YamlError>,
}

fn marker(mark: yaml_rust2::scanner::Marker) -> Marker {
    // Columns from 1, as marked-yaml's own loader counts them.
    Marker::new(0, mark.index(), mark.line(), mark.col() + 1)
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, event: Event, mark: yaml_rust2::scanner::Marker) {
        if self.error.is_some() {
            return;
        }
        let mark = marker(mark);
        let done = match event {
            Event::Scalar(_, _, _, Some(_))
            | Event::MappingStart(_, Some(_))
            | Event::SequenceStart(_, Some(_)) => {
                self.error = Some(YamlError {
                    mark: Some(mark),
                    problem: "a YAML tag (`!name`) is not part of a rules file".to_owned(),
                });
                return;
            }
            Event::Scalar(value, _, anchor, None) => {
                let node = Node::from(MarkedScalarNode::new(Span::new_start(mark), value));
                self.anchored(anchor, node)
            }
            Event::Alias(anchor) => match self.anchors.get(&anchor) {
                Some(node) => node.clone(),
                None => {
                    self.error = Some(YamlError {
                        mark: Some(mark),
                        problem: "an alias to an anchor not yet defined".to_owned(),
                    });
                    return;
                }
            },
            Event::MappingStart(anchor, None) => {
                self.open.push(Open::Mapping {
                    start: mark,
                    anchor,
                    entries: Vec::new(),
                    key: None,
                });
                return;
            }
            Event::SequenceStart(anchor, None) => {
                self.open.push(Open::Sequence {
                    start: mark,
                    anchor,
                    items: Vec::new(),
                });
                return;
            }
            Event::MappingEnd => match self.open.pop() {
                Some(Open::Mapping {
                    start,
                    anchor,
                    entries,
                    ..
                }) => {
                    let span = Span::new_with_marks(start, mark);
                    match merged(entries) {
                        Ok(map) => {
                            self.anchored(anchor, Node::from(MarkedMappingNode::new(span, map)))
                        }
                        Err(error) => {
                            self.error = Some(error);
                            return;
                        }
                    }
                }
                _ => return,
            },
            Event::SequenceEnd => match self.open.pop() {
                Some(Open::Sequence {
                    start,
                    anchor,
                    items,
                }) => {
                    let span = Span::new_with_marks(start, mark);
                    self.anchored(anchor, Node::from(MarkedSequenceNode::new(span, items)))
                }
                _ => return,
            },
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart
            | Event::DocumentEnd => return,
        };
        self.place(done, mark);
    }
}

impl Builder {
    /// `node`, remembered under `anchor` if it has one (id 0 is none).
    fn anchored(&mut self, anchor: usize, node: Node) -> Node {
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
        }
        node
    }

    /// Puts a finished node where it belongs: a mapping's key or value, a sequence's item, or
    /// the document.
    fn place(&mut self, node: Node, mark: Marker) {
        match self.open.last_mut() {
            None => {
                if self.root.is_none() {
                    self.root = Some(node);
                }
            }
            Some(Open::Sequence { items, .. }) => items.push(node),
            Some(Open::Mapping { entries, key, .. }) => match key.take() {
                Some(key) => entries.push((key, node)),
                None => match node {
                    Node::Scalar(scalar) => *key = Some(scalar),
                    _ => {
                        self.error = Some(YamlError {
                            mark: Some(mark),
                            problem:
                                "a mapping's key must be a plain value, not a list or a mapping"
                                    .to_owned(),
                        });
                    }
                },
            },
        }
    }
}

/// A mapping's entries with its `<<` keys applied: each merged mapping (or each of a list of
/// them, earlier first) adds the keys the mapping does not write itself. A key written twice
/// keeps its last value.
fn merged(
    entries: Vec<(MarkedScalarNode, Node)>,
) -> Result<LinkedHashMap<MarkedScalarNode, Node>, YamlError> {
    let mut map = LinkedHashMap::new();
    let mut merges = Vec::new();
    for (key, value) in entries {
        if key.as_str() == MERGE_KEY {
            merges.push((key, value));
        } else {
            map.insert(key, value);
        }
    }
    for (key, value) in merges {
        let sources: Vec<Node> = match value {
            Node::Mapping(_) => vec![value],
            Node::Sequence(items) => items.iter().cloned().collect(),
            Node::Scalar(_) => vec![value],
        };
        for source in sources {
            let Node::Mapping(source) = source else {
                return Err(YamlError {
                    mark: key.span().start().copied(),
                    problem: "`<<` merges mappings (`<<: *name` or `<<: [*a, *b]`), not a value"
                        .to_owned(),
                });
            };
            for (merged_key, merged_value) in source.iter() {
                if !map.contains_key(merged_key) {
                    map.insert(merged_key.clone(), merged_value.clone());
                }
            }
        }
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line_of(node: &Node) -> usize {
        node.span().start().map_or(0, |m| m.line())
    }

    #[test]
    fn an_alias_is_its_anchors_value_at_the_anchors_line() {
        let tree = parse("a: &limit\n  unit: minute\n  requests_per_unit: 5\nb: *limit\n").unwrap();
        let map = tree.as_mapping().unwrap();
        let b = map.get_mapping("b").unwrap();
        assert_eq!(b.get_scalar("unit").unwrap().as_str(), "minute");
        assert_eq!(b.get_scalar("requests_per_unit").unwrap().as_str(), "5");
        assert_eq!(line_of(b.get_node("unit").unwrap()), 2);
    }

    #[test]
    fn a_merge_key_adds_what_the_mapping_does_not_write() {
        let tree = parse(
            "base: &base\n  unit: minute\n  requests_per_unit: 5\nrule:\n  <<: *base\n  requests_per_unit: 9\n",
        )
        .unwrap();
        let rule = tree.as_mapping().unwrap().get_mapping("rule").unwrap();
        assert_eq!(rule.get_scalar("unit").unwrap().as_str(), "minute");
        assert_eq!(rule.get_scalar("requests_per_unit").unwrap().as_str(), "9");
        assert!(rule.get_node("<<").is_none());
    }

    #[test]
    fn a_list_of_merges_takes_the_earlier_first() {
        let tree =
            parse("x: &x {unit: second}\ny: &y {unit: hour, name: y}\nrule:\n  <<: [*x, *y]\n")
                .unwrap();
        let rule = tree.as_mapping().unwrap().get_mapping("rule").unwrap();
        assert_eq!(rule.get_scalar("unit").unwrap().as_str(), "second");
        assert_eq!(rule.get_scalar("name").unwrap().as_str(), "y");
    }

    #[test]
    fn a_sequence_anchor_is_reused_whole() {
        let tree = parse("a: &list [1, 2]\nb: *list\n").unwrap();
        let b = tree.as_mapping().unwrap().get_sequence("b").unwrap();
        assert_eq!(b.len(), 2);
    }

    #[test]
    fn mistakes_are_named_where_they_are() {
        let unknown = parse("a: *nowhere\n").unwrap_err();
        assert!(unknown.problem.contains("unknown anchor"), "{unknown:?}");
        let merge = parse("rule:\n  <<: 5\n").unwrap_err();
        assert!(merge.problem.contains("merges mappings"), "{merge:?}");
        assert_eq!(merge.mark.map(|m| m.line()), Some(2));
        let tag = parse("a: !custom 5\n").unwrap_err();
        assert!(tag.problem.contains("tag"), "{tag:?}");
        let key = parse("? [a]\n: 1\n").unwrap_err();
        assert!(key.problem.contains("key must be a plain value"), "{key:?}");
    }

    #[test]
    fn an_empty_text_is_an_empty_mapping() {
        assert!(parse("").unwrap().as_mapping().unwrap().is_empty());
        assert!(
            parse("# only a comment\n")
                .unwrap()
                .as_mapping()
                .unwrap()
                .is_empty()
        );
    }
}
